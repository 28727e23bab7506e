"""Error classes. Each carries the exit code `train` ends with and a message
written for the person who reads the `failure` file.

Exit codes (also in the README):

==== =====================================================================
code meaning
==== =====================================================================
0    success
1-   the user's own exit code, passed through; a signal N becomes 128+N
64   command-line usage error (the `training-toolkit` CLI)
65   unsafe code archive (absolute path, ``..``, link leaving the code dir,
     device file)
66   code or entry point not found (missing file, S3 404)
69   a required program is missing (sshd, mpirun, torchrun, ...)
70   internal error in the toolkit (a bug: please report it)
72   installing the user's requirements or package failed
73   the job succeeded but `output/success` could not be written (the
     output dir read-only, not a directory, out of inodes); failures keep theirs
74   code fetch failed (I/O error, S3 retries exhausted within the deadline);
     with TRAINING_TOOLKIT_INTERMEDIATE_STRICT=1, a file of
     output/intermediate/ not in S3 as it is at the end of a successful job;
     with TRAINING_TOOLKIT_CHECKPOINT_STRICT=1, a newest checkpoint not
     durable in S3 at the end
77   access denied (S3 403: the code, or the checkpoint prefix at start)
78   bad job configuration (a file, field or hyperparameter is invalid)
79   the cluster could not be formed or was lost (hosts unreachable over
     SSH, the master host vanished)
==== =====================================================================
"""
from .redact import mask_argv, one_line


class ToolkitError(Exception):
    """Base of every error the toolkit reports. ``exit_code`` is what `train`
    exits with; ``message`` is the summary for the failure file (``str(err)``
    too, except for a failed process, whose str also carries its output)."""

    exit_code = 70

    def __init__(self, *args, exit_code=None):
        # Any arguments, as the reference's ClientError (a bare Exception)
        # takes them: toolkits raise ClientError(e), some ClientError(errno,
        # text) as an OSError; the message is their text as Exception gives it.
        super().__init__(*args)
        self.message = Exception.__str__(self)
        self.exit_code = failure_code(exit_code, self.exit_code)

    def __str__(self):
        return self.message

    @property
    def kind(self):
        return type(self).__name__

    @property
    def label(self):
        """What the failure file's first line starts with."""
        return self.kind


def some_of(names, most=10):
    """`names` for a message: the first `most`, then how many more (a job of
    thousands of hosts must not make a failure file of all their names)."""
    names = [str(n) for n in names]
    return ", ".join(names[:most]) + (" and %d more" % (len(names) - most)
                                      if len(names) > most else "")


def failure_code(*candidates):
    """The first of `candidates` that an exit status can carry as a failure
    (an int 1-255), else 1: a string, None, True, 0 or 256 (which a process
    would end with as 0) is never a failed job's exit code."""
    for code in candidates:
        if isinstance(code, int) and not isinstance(code, bool) and 0 < code < 256:
            return code
    return 1


class InternalError(ToolkitError):
    exit_code = 70


class ClientError(ToolkitError):
    """An error caused by the job: its code, its configuration or its data.
    Same name and role as in sagemaker-training."""

    exit_code = 1


class UsageError(ClientError):
    exit_code = 64


class ConfigError(ClientError):
    """Bad job configuration. Names the file and field."""

    exit_code = 78

    def __init__(self, message, path=None, field=None):
        where = ""
        if path and field:
            where = "%s: field %r: " % (path, field)
        elif path:
            where = "%s: " % path
        elif field:
            where = "%s: " % field
        super().__init__(where + message)
        self.path = path
        self.field = field


class CodeFetchError(ClientError):
    """The user's code could not be fetched. Names the URI."""

    exit_code = 74

    def __init__(self, message, uri=None):
        super().__init__(message)
        self.uri = uri


class CodeNotFoundError(CodeFetchError):
    exit_code = 66


class AccessDeniedError(CodeFetchError):
    exit_code = 77


class UnsafeArchiveError(CodeFetchError):
    exit_code = 65


class MissingProgramError(ClientError):
    """A program the runner needs is not installed in the image."""

    exit_code = 69


class ClusterError(ClientError):
    exit_code = 79


class OutputWriteError(ToolkitError):
    """The job succeeded but `output/success` could not be written: `train`
    does not report a success it could not record."""

    exit_code = 73

    def __init__(self, path, reason):
        super().__init__("cannot write %s: %s; the job's program succeeded, but its success "
                         "could not be recorded (check the output dir's mount, space and "
                         "inodes)" % (path, reason))
        self.path = path


class OutputNotDurableError(ToolkitError):
    """The job succeeded, but files of output/intermediate/ may not be in S3
    with their last content, and TRAINING_TOOLKIT_INTERMEDIATE_STRICT=1
    makes that a failure."""

    exit_code = 74

    def __init__(self, uri, paths, strict_env):
        named = some_of(paths)
        super().__init__(
            "%d files of output/intermediate/ may not be in S3 as they are now, and %s=1 makes "
            "that a failure (the job's program succeeded): %s (every one in status.json's "
            "intermediate.not_durable, with the last error; destination %s)"
            % (len(paths), strict_env, named, uri))
        self.paths = list(paths)


class CheckpointAccessError(ClientError):
    """The checkpoint prefix cannot be read at start (S3 403): nothing of
    the job ran, and no checkpoint would have been kept."""

    exit_code = 77


class CheckpointRestoreError(ClientError):
    """The job's committed checkpoint could not be restored on every host
    (a host could not reach S3, a download failed, a host did not report):
    no host starts, so none resumes from another step. EX_TEMPFAIL: a
    code to requeue on; the message names the host and the unit."""

    exit_code = 75


class CheckpointNotDurableError(ToolkitError):
    """The newest checkpoint is not in S3 at the end, and
    TRAINING_TOOLKIT_CHECKPOINT_STRICT=1 makes that a failure."""

    exit_code = 74


class NoProgressError(ClientError):
    """Restarts in place made no progress (no higher heartbeat step, no newer
    checkpoint) in TRAINING_TOOLKIT_MAX_NO_PROGRESS_RESTARTS attempts in a
    row: "do not requeue" (NVIDIA's ft_launcher's code)."""

    exit_code = 93


class PreflightError(ClientError):
    """A hard failure of the job's pre-flight (TRAINING_TOOLKIT_PREFLIGHT):
    the message names the host and the check; no user process ran."""

    exit_code = 202

    def __init__(self, message, hosts=()):
        super().__init__(message)
        self.hosts = list(hosts)  # the hosts that failed a check, or did not report


class HostReplacedError(ClientError):
    """This host left the job (lost, late, or unfit) and a spare host took
    its place (TRAINING_TOOLKIT_SPARE_HOSTS): the job goes on without it, and
    does not take it back."""

    exit_code = 203


class SMTrainingCompilerConfigurationError(ConfigError):
    """The SageMaker Training Compiler is configured wrongly (the
    reference's name)."""

    def __init__(self, *args):
        # The reference's is a bare Exception: any arguments, no file or field.
        ClientError.__init__(self, *args)
        self.path = self.field = None


class ChannelDoesNotExistError(ClientError):
    """A data channel the job does not have was asked for."""

    exit_code = 78

    def __init__(self, channel_name):
        super().__init__("Channel %s is not a valid channel" % (channel_name,))
        self.channel_name = channel_name


class UnsupportedFormatError(ClientError):
    """A content type the framework cannot (de)serialize."""

    def __init__(self, content_type, **kwargs):
        super().__init__(
            "Content type %s is not supported by this framework.\n\n"
            "Please implement input_fn to deserialize the request data or an output_fn to\n"
            "serialize the response. For more information, see the SageMaker Python SDK README."
            % (content_type,))
        self.content_type = content_type


class ImportModuleError(ClientError):
    exit_code = 78


# Where SageMaker Training Compiler code lives: an exception raised from there
# is labelled as the compiler's, as the reference labels it.
TRAINING_COMPILER_PATHS = ("tensorflow/compiler/xla", "tensorflow/compiler/tf2xla",
                           "tensorflow/python/compiler/xla", "torch_xla/")


class FrameworkError(ClientError):
    """A framework hook (SAGEMAKER_TRAINING_MODULE) raised. The failure file
    starts with the reference's label, `Framework Error:` or, for an error
    from Training Compiler code, `SMTrainingCompiler Error:`, which
    monitoring matches in FailureReason. The exit code is the exception's
    errno where it has one that an exit status can carry, as in the
    reference, else 1."""

    def __init__(self, hook, error, traceback_text):
        super().__init__("the framework hook %s failed:\n%s" % (hook, traceback_text))
        self.compiler = any(path in traceback_text for path in TRAINING_COMPILER_PATHS)
        self.exit_code = failure_code(getattr(error, "errno", None), self.exit_code)
        # The tail of a failed user process the hook's error came from, if any.
        cause = error
        while isinstance(cause, BaseException) and not isinstance(cause, _CalledProcessError):
            cause = cause.__cause__ or cause.__context__
        self.stderr_tail = cause.stderr_tail if isinstance(cause, _CalledProcessError) else b""

    @property
    def label(self):
        return "SMTrainingCompiler Error" if self.compiler else "Framework Error"


class _CalledProcessError(ClientError):
    """A command failed. The call shape is sagemaker_training's, ``(cmd,
    return_code=None, output=None, info=None)``; ``stderr_tail`` is another
    name for ``output`` (the last bytes of its stderr), ``where`` says which
    host or rank failed, ``message`` replaces the default summary.

    ``message`` is one line (what failed, how, where); ``str(err)`` is the
    reference's layout, output included, because framework toolkits search it
    (PyTorch's looks for 'gloo::EnforceNotMet'). ``return_code`` is an int,
    where the reference keeps a str.
    """

    def __init__(self, cmd, return_code=None, output=None, info=None, *, stderr_tail=None,
                 where=None, message=None):
        self.cmd = cmd
        self.return_code = _as_int(return_code)
        self.output = output if stderr_tail is None else stderr_tail
        self.extra_info = info
        self.where = where
        super().__init__(message or self._summary())

    @property
    def stderr_tail(self):
        return b"" if self.output is None else self.output

    @stderr_tail.setter
    def stderr_tail(self, value):
        self.output = value

    def _summary(self):
        code = self.return_code
        how = "exit code %s" % (code,)
        if isinstance(code, int) and code > 128:
            import signal

            try:
                how += " (killed by %s)" % signal.Signals(code - 128).name
            except ValueError:
                pass
        where = " on %s" % (self.where,) if self.where else ""
        cmd = _masked(self.cmd)
        if isinstance(cmd, (list, tuple)):
            cmd = " ".join(str(part) for part in cmd)
        if not cmd:  # a host that ran none of the ranks itself (an MPI worker)
            return "%s%s" % (how, where)
        return "%s%s: %s" % (how, where, one_line(cmd))

    def __str__(self):
        output = self.output
        if isinstance(output, (bytes, bytearray)):
            # A tail can start inside a multi-byte character.
            output = bytes(output).decode("utf-8", "replace")
        lines = ["%s:" % type(self).__name__, "ExitCode %s" % self.return_code,
                 'ErrorMessage "%s"' % (output or "")]
        if self.extra_info is not None:
            lines.append('ExtraInfo "%s"' % (self.extra_info,))
        lines.append('Command "%s"' % (_masked(self.cmd),))
        return "\n".join(lines).strip()


def _masked(cmd):
    """A failed command as messages show it, in the type it came in:
    secret-looking hyperparameter values masked (see redact)."""
    if isinstance(cmd, (list, tuple)):
        masked = mask_argv(cmd)
        return cmd if masked == [str(part) for part in cmd] else type(cmd)(masked)
    if isinstance(cmd, str):
        import shlex

        try:
            parts = shlex.split(cmd)
        except ValueError:
            return cmd
        masked = mask_argv(parts)
        return cmd if masked == parts else " ".join(masked)
    return cmd


def _as_int(code):
    try:
        return int(code)
    except (TypeError, ValueError, OverflowError):  # OverflowError: inf
        return code


class InstallError(_CalledProcessError):
    exit_code = 72


class InstallRequirementsError(InstallError):
    pass


class InstallModuleError(InstallError):
    pass


class HangError(ClientError):
    """The hang watchdog ended the job: a rank made no progress in time.
    ``hang`` is the verdict (resilience.hang.HangVerdict); the exit code is
    its own (TRAINING_TOOLKIT_HANG_EXIT_CODE, 200 by default)."""

    exit_code = 200

    def __init__(self, hang, stderr_tail=b""):
        if callable(getattr(hang, "headline", None)):
            super().__init__("\n".join([hang.headline()] + hang.details()),
                             exit_code=hang.exit_code)
        else:  # a message, as any error class takes one
            super().__init__(hang)
        self.hang = hang
        self.stderr_tail = stderr_tail


class ExecuteUserScriptError(_CalledProcessError):
    """The user's process failed. ``exit_code`` is its own exit code (signal N
    -> 128+N); ``stderr_tail`` the last bytes it wrote to stderr."""

    def __init__(self, cmd, return_code=None, output=None, info=None, **kwargs):
        super().__init__(cmd, return_code, output, info, **kwargs)
        self.exit_code = failure_code(self.return_code)
