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

MASK = "***"
SECRET_WORDS = ("password", "passwords", "passwd", "passphrase", "secret", "secrets", "token",
                "key", "keys", "credential", "credentials")
# Characters that end a line, or move the cursor, for some reader of a file
# or terminal (str.splitlines() breaks at \x0b-\x0d, \x1c-\x1e, \x85, \u2028/9),
# each to its escape. (No `re`: importing it costs `train` milliseconds.)
_CONTROL = {c: ascii(chr(c))[1:-1] for c in (*range(0x00, 0x09), *range(0x0a, 0x20),
                                              *range(0x7f, 0xa0), 0x2028, 0x2029)}


def _words(name):
    """The words of a name: ASCII letters and digits, split at anything
    else, between letters and digits, and at camelCase humps (`APIKey`:
    API, Key)."""
    words, word = [], ""
    for i, c in enumerate(name):
        if not (c.isascii() and c.isalnum()):
            if word:
                words.append(word)
            word = ""
            continue
        if word:
            prev, after = word[-1], name[i + 1:i + 2]
            if (c.isdigit() != prev.isdigit() or (c.isupper() and prev.islower())
                    or (c.isupper() and prev.isupper() and after.isascii() and after.islower())):
                words.append(word)
                word = ""
        word += c
    if word:
        words.append(word)
    return words


def is_secret_key(name):
    return any(word.lower().endswith(SECRET_WORDS) for word in _words(str(name)))


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
    return str(text).translate(_CONTROL)


def scrub(data, secrets):
    """`data` (str or bytes, e.g. a block of a child's output) with every
    occurrence of each of `secrets` (strings the toolkit knows are secret,
    such as an index token) replaced by MASK."""
    for secret in secrets:
        if not secret:
            continue
        if isinstance(data, (bytes, bytearray)):
            data = bytes(data).replace(secret.encode("utf-8"), MASK.encode())
        else:
            data = data.replace(secret, MASK)
    return data
