"""The tree watcher: which files under the root are to be uploaded.

One inotify instance reads the whole tree: files closed after writing, files
moved or renamed into it, new directories (watched first, then listed, so
that files created in them meanwhile are not missed), and files already
present at start. A rename that follows a close within a few ms (the
atomic-save pattern) cancels the upload of the temporary name. An
event-queue overflow rescans the tree; without inotify at all (the library
missing, the per-user instance limit reached) the tree is rescanned every
RESCAN_S seconds. inotify_simple is imported only here.
"""
import os
import time

from .. import log
from .verify import signature

# After the first event of a burst, read a little later so that a rename
# following a close arrives in the same batch (the upload of the temporary
# name is then never started).
SETTLE_S = 0.003
# Without inotify, the tree is rescanned this often.
RESCAN_S = 10.0
# The reference's own staging dir inside intermediate/: never uploaded.
REFERENCE_TMP_DIR = ".tmp.sagemaker_s3_sync"


class TreeWatcher:
    """Watches `root` and calls `want(rel)` for each file to upload, and
    `gone(rel)` for each file deleted or moved away. A rescan wants only the
    files for which `changed(rel)` is true (they differ from what went up);
    `record_error(err, what)` hears of what cannot be watched; `rules`
    (s3sync.rules) say which deleted file goes first (a marker)."""

    def __init__(self, root, want, changed, record_error, rescan_s=RESCAN_S, gone=None,
                 rules=None):
        self.root = root
        self._want = want
        self._changed = changed
        self._record_error = record_error
        self._rescan_s = rescan_s
        self._gone = gone or (lambda rel: None)
        self._rules = rules
        self._watches = {}  # wd -> relative dir ("" for the root)
        self._inotify = None
        self.next_rescan = None  # monotonic time of the next rescan, when there is no inotify

    def start(self):
        """Watch the tree (or plan its rescans) and want what is there."""
        try:
            import inotify_simple

            flags = inotify_simple.flags
            self._f = flags
            self._mask = (flags.CLOSE_WRITE | flags.MOVED_TO | flags.MOVED_FROM | flags.CREATE
                          | flags.DELETE | flags.ONLYDIR)
            self._inotify = inotify_simple.INotify()
        except (ImportError, OSError) as err:
            # No inotify (the library missing, the per-user instance limit
            # reached): rescan the tree every rescan_s seconds instead.
            self._inotify = None
            self.next_rescan = time.monotonic() + self._rescan_s
            self._record_error(err, "no inotify; rescanning %s every %g s instead"
                               % (self.root, self._rescan_s))
        self.add_tree("", rescan=True)  # a file known to be in S3 already (restored) stays

    def fileno(self):
        """The inotify descriptor to poll, or None without inotify."""
        return self._inotify.fileno() if self._inotify is not None else None

    def on_ready(self):
        """The inotify descriptor is readable: take the burst of events."""
        time.sleep(SETTLE_S)
        self._handle_events(self._inotify.read(timeout=0))

    def take_pending(self):
        """Take the events already queued, without waiting."""
        if self._inotify is not None:
            self._handle_events(self._inotify.read(timeout=0))

    def rescan_if_due(self):
        if self._inotify is None and time.monotonic() >= self.next_rescan:
            self.next_rescan = time.monotonic() + self._rescan_s
            self.add_tree("", rescan=True)

    def close(self):
        if self._inotify is not None:
            self._inotify.close()

    def present(self):
        """relative path -> signature of every regular file under the root."""
        present = {}
        for rel, entry in self._files_under(""):
            try:
                present[rel] = signature(entry.stat())
            except OSError:
                continue
        return present

    def add_tree(self, rel_dir, rescan=False):
        """Watch `rel_dir` and every directory under it, each before it is
        listed, and want every file found (only changed ones when `rescan`)."""
        for rel, _ in self._files_under(rel_dir, self._watch if self._inotify else None):
            if not rescan or self._changed(rel):
                self._want(rel)

    def _abs(self, rel):
        return os.path.join(self.root, rel) if rel else self.root

    def _files_under(self, rel_dir, on_dir=None):
        """(relative path, DirEntry) of every regular file under `rel_dir`,
        links not followed, the reference's temp dir left out. `on_dir(rel)`
        runs on each directory before it is listed."""
        stack = [rel_dir]
        while stack:
            rel = stack.pop()
            if on_dir is not None:
                on_dir(rel)
            try:
                entries = list(os.scandir(self._abs(rel)))
            except OSError:
                continue
            for entry in entries:
                child = entry.name if not rel else rel + "/" + entry.name
                try:
                    if entry.is_dir(follow_symlinks=False):
                        if child != REFERENCE_TMP_DIR:
                            stack.append(child)
                        continue
                    is_file = entry.is_file()
                except OSError:
                    continue
                if is_file:
                    yield child, entry

    def _watch(self, rel):
        path = self._abs(rel)
        try:
            self._watches[self._inotify.add_watch(path, self._mask)] = rel
        except OSError as err:
            if os.path.isdir(path):
                # e.g. the max_user_watches limit: what is there now goes
                # up, what comes later at the end.
                self._record_error(err, "cannot watch %s" % path)

    def _forget_tree(self, rel_dir):
        """A directory moved away: drop its watches (a move within the tree
        adds them again with the new path)."""
        prefix = rel_dir + "/"
        for wd, rel in list(self._watches.items()):
            if rel == rel_dir or rel.startswith(prefix):
                del self._watches[wd]
                try:
                    self._inotify.rm_watch(wd)
                except OSError:
                    pass

    def _handle_events(self, events):
        f = self._f
        wanted = {}  # rel -> True (upload) / False (moved away): the batch's last word
        for event in events:
            if event.mask & f.Q_OVERFLOW:
                log.warning("%s: inotify queue overflowed; rescanning %s"
                            % (self._rules.label if self._rules else "intermediate output",
                               self.root))
                self.add_tree("", rescan=True)
                continue
            if event.mask & f.IGNORED:
                self._watches.pop(event.wd, None)
                continue
            parent = self._watches.get(event.wd)
            if parent is None or not event.name:
                continue
            rel = event.name if not parent else parent + "/" + event.name
            if event.mask & f.ISDIR:
                if event.mask & (f.CREATE | f.MOVED_TO):
                    if rel != REFERENCE_TMP_DIR:
                        self.add_tree(rel, rescan=True)
                elif event.mask & f.MOVED_FROM:
                    self._forget_tree(rel)
                    wanted[rel] = False
                elif event.mask & f.DELETE:
                    # Its files' deletes may have come while it was still
                    # there (a large file is slow to free): it is gone now.
                    wanted[rel] = False
            elif event.mask & (f.CLOSE_WRITE | f.MOVED_TO):
                wanted[rel] = True
            elif event.mask & (f.MOVED_FROM | f.DELETE):
                wanted[rel] = False
            elif event.mask & f.CREATE:
                # Most new files are written and closed (CLOSE_WRITE follows);
                # a hard link or symlink never is.
                try:
                    st = os.lstat(self._abs(rel))
                    if os.path.islink(self._abs(rel)) or st.st_nlink > 1:
                        wanted[rel] = True
                except OSError:
                    pass
        # A marker brings the rest of its unit first, and leaves S3 before
        # the rest of it (Uploads.want, Uploads._after_marker).
        for rel, want in wanted.items():
            if want:
                self._want(rel)
        for rel, want in wanted.items():
            if not want:
                self._gone(rel)
