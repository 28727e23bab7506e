"""What the toolkit shows of a job: secret-looking values masked, and
untrusted text kept on one line.

The user's own argv and environment carry every value (that is the
contract); the toolkit's outputs (`failure`, `status.json`, its log lines,
`training-toolkit plan` and `env`) show `***` instead of the value of any key
that looks secret. A key looks secret when one of its words (split at
anything but letters and digits, and at camelCase humps), ignoring case, ends
with one of SECRET_WORDS: `api_key`, `hfToken`, `DB_PASSWORD`, `SM_HP_API_KEY`
and `aws-secret-access-key` do; `keep_prob`, `tokenizer`, `max_tokens` and
`keyword` do not.
"""
import json
import re

MASK = "***"
SECRET_WORDS = ("password", "passwords", "passwd", "passphrase", "secret", "secrets", "token",
                "key", "keys", "credential", "credentials")
_WORDS = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")
# Characters that end a line, or move the cursor, for some reader of a file
# or terminal (str.splitlines() breaks at \x0b-\x0d, \x1c-\x1e, \x85, \u2028/9).
_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")


def is_secret_key(name):
    return any(word.lower().endswith(SECRET_WORDS) for word in _WORDS.findall(str(name)))


def mask_argv(argv):
    """`--key value` and `--key=value` with the value masked when the key
    looks secret; JSON objects given as values are masked inside."""
    out, hide_next = [], False
    for arg in argv:
        arg = str(arg)
        if hide_next:
            out.append(MASK)
            hide_next = False
        elif arg.startswith("-") and is_secret_key(arg.lstrip("-").partition("=")[0]):
            flag, eq, _ = arg.partition("=")
            out.append(flag + "=" + MASK if eq else arg)
            hide_next = not eq
        else:
            out.append(mask(arg))
    return out


def mask(value):
    """`value` with secret-looking keys' values masked: dicts by key, lists of
    strings as argv, strings that hold a JSON object or list (SM_HPS,
    SM_USER_ARGS, SM_TRAINING_ENV) inside. Anything else as it is."""
    if isinstance(value, dict):
        return {k: MASK if is_secret_key(k) else mask(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        if all(isinstance(v, str) for v in value):
            return mask_argv(value)
        return [mask(v) for v in value]
    if isinstance(value, str) and value[:1] in ("{", "["):
        try:
            decoded = json.loads(value)
        except ValueError:
            return value
        masked = mask(decoded)
        return value if masked == decoded else json.dumps(masked, separators=(",", ":"))
    return value


def one_line(text):
    """`text` with line breaks and other control characters (tab excepted)
    escaped, so that it cannot forge a line of a report or a log."""
    return _CONTROL.sub(lambda m: ascii(m.group())[1:-1], str(text))
