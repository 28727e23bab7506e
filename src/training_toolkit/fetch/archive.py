"""Safe extraction of a code archive (tar, gzip'd, bzip2'd or xz'd) into the
code dir.

Members are checked one by one as they stream in, and extraction goes to a
sibling staging dir that is moved into place only when the whole archive was
good, so a bad archive leaves the code dir untouched and nothing is ever
written outside it. An archive is good when it is whole: the gzip trailer
(CRC-32 and length) matches and the tar ends with its end-of-archive block.

Gzip is decompressed by ISA-L's igzip (the ``isal`` package, several times
faster than zlib on compressible data; see docs/benchmarks.md), or by the
standard ``gzip`` module where ``isal`` is not installed; both check the
trailer. Decompression happens outside tarfile, whose own stream reader keeps
all the output of one compressed read and copies it again for every read
from it: quadratic in the compression ratio.

The archive is any file object that reads forward (an open file, the S3
stream); tarfile and the decompressors are imported only here.
"""
import os
import shutil

from .. import errors

_COPY_BUFSIZE = 1 << 20  # reads of the decompressed tar stream, file writes


def extract(fileobj, code_dir, uri, tar_filter):
    """Extract the archive `fileobj` into `code_dir`; return the member
    count. `tar_filter` names tarfile's own extraction filter (Python
    3.11.4+), a second line of defence that the checks here do not rely on.
    Extraction goes to a staging dir next to `code_dir` (same file system, so
    the final move is a rename) that is removed whatever happens.

    Raises UnsafeArchiveError (a member that would escape the code dir, a
    device file) or CodeFetchError (a corrupt or cut archive, an I/O error),
    each naming `uri`."""
    import tempfile

    code_dir = os.path.abspath(code_dir)
    parent = os.path.dirname(code_dir)
    try:
        os.makedirs(parent, exist_ok=True)
        staging = tempfile.mkdtemp(prefix=os.path.basename(code_dir) + ".partial-", dir=parent)
    except OSError as err:
        raise errors.CodeFetchError("cannot create a staging dir next to %s for %s: %s"
                                    % (code_dir, uri, err), uri) from err
    try:
        os.chmod(staging, 0o755)  # mkdtemp's 0700 would become the code dir's mode
        count = _extract_members(fileobj, staging, uri, tar_filter)
        _move_into_place(staging, code_dir, uri)
        return count
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _extract_members(fileobj, root, uri, tar_filter):
    """Stream the members of the archive `fileobj` into `root`, refusing
    unsafe ones and incomplete or corrupt archives; return the member count."""
    import tarfile

    real_root = os.path.realpath(root)
    regular_files = set()  # regular files extracted so far: the only valid hard-link targets
    symlinks, directories = [], []
    count = 0
    filter_kwargs = {"filter": tar_filter} if hasattr(tarfile, "data_filter") else {}
    filter_error = getattr(tarfile, "FilterError", ())  # () matches nothing before 3.11.4
    stream, corrupt_errors = _decompressed(fileobj)
    try:
        # "r:", not the stream mode "r|": tarfile reads the members' data
        # straight from the decompressed stream, which seeks only forward.
        with tarfile.open(fileobj=stream, mode="r:", copybufsize=_COPY_BUFSIZE,
                          tarinfo=_whole_tarinfo_class()) as tar:
            for member in tar:
                _check_member(member, root, real_root, regular_files, uri)
                # Directory modes are set at the end, as extractall does, so a
                # read-only directory does not block its own members.
                tar.extract(member, root, set_attrs=not member.isdir(), **filter_kwargs)
                count += 1
                name = os.path.normpath(member.name)
                if member.isreg():
                    regular_files.add(name)
                    continue
                regular_files.discard(name)
                if member.issym():
                    symlinks.append(member)
                elif member.isdir():
                    directories.append(member)
        # The gzip trailer (CRC-32, length) is checked once the stream is read
        # to its end, past the tar's end-of-archive block and padding.
        while stream.read(_COPY_BUFSIZE):
            pass
        _check_final_links(symlinks, root, real_root, uri)
        for member in reversed(directories):
            # Like the data filter: no setuid/setgid/sticky, no group/other
            # write; the owner can always enter and write.
            os.chmod(os.path.join(root, member.name), member.mode & 0o755 | 0o700)
    except filter_error as err:
        raise _unsafe(uri, err.tarinfo, str(err)) from err
    # Before OSError: gzip.BadGzipFile (a wrong CRC or length) is one.
    except (tarfile.TarError, EOFError) + corrupt_errors as err:
        raise errors.CodeFetchError("code archive %s is corrupt or incomplete: %s" % (uri, err),
                                    uri) from err
    except OSError as err:
        raise errors.CodeFetchError("extracting %s failed: %s" % (uri, err), uri) from err
    return count


def _decompressed(fileobj):
    """Return the tar stream inside `fileobj` (gzip, bzip2, xz or plain tar,
    told apart by their leading bytes, as tarfile's "r|*" did), and the
    exceptions that mean its compressed data is corrupt besides EOFError (cut
    short). Each reader checks its format's own checksums."""
    head = fileobj.peek(6)[:6]
    if head.startswith(b"\x1f\x8b"):
        gzip, zlib = gzip_modules()
        return gzip.GzipFile(fileobj=fileobj, mode="rb"), (gzip.BadGzipFile, zlib.error)
    if head.startswith(b"BZh"):
        import bz2

        return bz2.BZ2File(fileobj), ()  # corrupt data: OSError("Invalid data stream")
    if head.startswith(b"\xfd7zXZ\x00"):
        import lzma

        return lzma.LZMAFile(fileobj), (lzma.LZMAError,)
    return fileobj, ()


def gzip_modules():
    """The gzip and zlib modules to decompress with: isal's igzip and
    isal_zlib (drop-in replacements, several times faster), or the standard
    library's where isal is not installed."""
    try:
        from isal import igzip as gzip
        from isal import isal_zlib as zlib
    except ImportError:
        import gzip
        import zlib
    return gzip, zlib


def _whole_tarinfo_class():
    """A TarInfo class for tarfile's `tarinfo` argument that refuses what
    tarfile quietly takes for the end of the archive: no data, half a header
    block or an invalid header where the next member should be. Only a zero
    block (the end-of-archive marker) ends the member list."""
    import tarfile

    class WholeTarInfo(tarfile.TarInfo):
        @classmethod
        def fromtarfile(cls, tar):
            try:
                return super().fromtarfile(tar)
            except (tarfile.EmptyHeaderError, tarfile.TruncatedHeaderError) as err:
                raise tarfile.ReadError("the tar ends at byte %d without its end-of-archive block"
                                        % tar.offset) from err
            except tarfile.InvalidHeaderError as err:
                raise tarfile.ReadError("invalid tar header at byte %d (%s)"
                                        % (tar.offset, err)) from err

    return WholeTarInfo


def _check_final_links(symlinks, root, real_root, uri):
    """Check every symlink again once all members are out: a later member can
    redirect a link checked earlier, by turning a file the link's target goes
    through into a link. Once every link resolves inside, so does every path
    under the root (member names have no '..')."""
    for member in symlinks:
        if not _is_inside(os.path.realpath(os.path.join(root, member.name)), real_root):
            raise _unsafe(uri, member,
                          "is a symlink that leads outside the code dir once the archive is out")


def _check_member(member, root, real_root, regular_files, uri):
    """Raise UnsafeArchiveError unless `member` stays inside `root`.

    Paths are resolved against what is already extracted, so a member cannot
    reach outside through a symlink extracted before it.
    """
    name = member.name
    if name.startswith("/"):
        raise _unsafe(uri, member, "has an absolute path")
    if ".." in name.split("/"):
        raise _unsafe(uri, member, "has a '..' component")
    if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
        raise _unsafe(uri, member, "is a device file, FIFO or other special file")
    dest = os.path.join(root, name)
    if not _is_inside(os.path.realpath(dest), real_root):
        raise _unsafe(uri, member, "would be written outside the code dir through a symlink")
    if member.issym():
        if member.linkname.startswith("/"):
            raise _unsafe(uri, member, "is a symlink to an absolute path (%s)" % member.linkname)
        target = os.path.realpath(os.path.join(os.path.dirname(dest), member.linkname))
        if not _is_inside(target, real_root):
            raise _unsafe(uri, member,
                          "is a symlink pointing outside the code dir (%s)" % member.linkname)
    elif member.islnk() and os.path.normpath(member.linkname) not in regular_files:
        raise _unsafe(uri, member, "is a hard link to %s, which is not a regular file extracted "
                                   "before it" % member.linkname)


def _is_inside(path, real_root):
    return path == real_root or path.startswith(real_root + os.sep)


def _unsafe(uri, member, why):
    return errors.UnsafeArchiveError("unsafe code archive %s: member %r %s"
                                     % (uri, member.name, why), uri)


def _move_into_place(staging, code_dir, uri):
    """Move the extracted tree to `code_dir`: one atomic rename when
    `code_dir` is missing or empty, else entry by entry."""
    try:
        os.rename(staging, code_dir)
        return
    except OSError:
        pass  # e.g. code_dir is a mount point (EBUSY) or on another file system (EXDEV)
    try:
        os.makedirs(code_dir, exist_ok=True)
        for entry in os.listdir(staging):
            shutil.move(os.path.join(staging, entry), os.path.join(code_dir, entry))
    except OSError as err:
        raise errors.CodeFetchError("moving the code from %s into %s failed: %s"
                                    % (uri, code_dir, err), uri) from err
