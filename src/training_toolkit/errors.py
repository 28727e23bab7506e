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
74   code fetch failed (I/O error, S3 retries exhausted within the deadline)
77   access denied (S3 403)
78   bad job configuration (a file, field or hyperparameter is invalid)
79   the cluster could not be formed or was lost (hosts unreachable over
     SSH, the master host vanished)
==== =====================================================================
"""


class ToolkitError(Exception):
    """Base of every error the toolkit reports. ``exit_code`` is what `train`
    exits with; ``str(err)`` is the message for the failure file."""

    exit_code = 70

    def __init__(self, message, exit_code=None):
        super().__init__(message)
        self.message = message
        if exit_code is not None:
            self.exit_code = exit_code

    def __str__(self):
        return self.message

    @property
    def kind(self):
        return type(self).__name__


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


class ImportModuleError(ClientError):
    exit_code = 78


class InstallError(ClientError):
    exit_code = 72


class InstallRequirementsError(InstallError):
    pass


class InstallModuleError(InstallError):
    pass


class ExecuteUserScriptError(ClientError):
    """The user's process failed. ``exit_code`` is its own exit code (signal N
    -> 128+N); ``stderr_tail`` the last bytes it wrote to stderr."""

    def __init__(self, cmd, return_code, stderr_tail=b"", where=None):
        self.cmd = list(cmd)
        self.return_code = return_code
        self.stderr_tail = stderr_tail
        self.where = where
        super().__init__(self._summary(), exit_code=return_code)

    def _summary(self):
        code = self.return_code
        how = "exit code %d" % code
        if code > 128:
            import signal

            try:
                how += " (killed by %s)" % signal.Signals(code - 128).name
            except ValueError:
                pass
        where = " on %s" % self.where if self.where else ""
        return "%s%s: %s" % (how, where, " ".join(self.cmd))
