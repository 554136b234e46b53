"""The MLflow store: where it is, creating it, and a client whose every call survives a busy store.

This package (``ablate.tracking``) is the project's only code that talks to MLflow. All calls go
through an explicit ``MlflowClient(tracking_uri=...)`` (fluent global state would leak between the
cells of a reused Ray worker) and retry while SQLite is locked by another writer or a server
answers 5xx.

Two reads and three writes go around MLflow's client, on purpose and only here. The writes:
``sqlite_start_clock`` moves a cell's start time to when it really started, ``sqlite_move_artifacts``
points a moved study folder's artifact locations at its new place (MLflow has calls for neither),
and ``new_sqlite_store`` copies a new store from an empty one MLflow built once, instead of running
MLflow's schema migrations again for each (1-2 s; a test holds the copy equal to MLflow's own).
The reads: ``check_sqlite_file`` reads a SQLite store's schema once through a read-only
connection, so that a damaged file is refused in one line, untouched (MLflow answers it with a
traceback); ``sqlite_points`` reads a run's metric points straight from the SQLite store's
``metrics`` table. MLflow's ``get_metric_history`` lets SQLite pick the primary-key index and scan
every run's points of the key (200 runs x 2,000 points: ~100 s against ~3 s for the same read
ordered by step, which makes SQLite use the index (run_uuid, key, step)).
``tests/ablate/tracking/test_tracking.py`` pins the table's columns and checks that
``sqlite_points`` and MLflow's read return the same points, so an MLflow upgrade that changes the
schema fails a test, not a study. Other stores (an ``mlflow server``) are read through the client.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import os
import random
import shutil
import sqlite3
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlparse

from ablate.errors import DamagedStoreError, MissingStoreError, TrackingError
from backends.env import cache_dir

_RETRY_S = 120.0  # how long a write keeps retrying a busy or unreachable store
MAX_METRICS = 1000  # mlflow.utils.validation.MAX_METRICS_PER_BATCH
MAX_PARAMS = 100  # MAX_PARAMS_TAGS_PER_BATCH
MAX_PARAM_LEN = 6000  # MAX_PARAM_VAL_LENGTH
MAX_TAG_LEN = 8000  # MAX_TAG_VAL_LENGTH
T = TypeVar("T")


def default_uri(output_dir: str | Path) -> str:
    """The SQLite store inside a study's output folder."""
    return "sqlite:///" + str(Path(output_dir).resolve() / "mlflow.db")


def is_local_store(uri: str) -> bool:
    """Whether the store is a file that only this machine can reach (SQLite, a file store)."""
    scheme = urlparse(uri).scheme
    return scheme in ("sqlite", "file", "") or len(scheme) == 1  # len 1: a Windows drive letter


_SERVER_FIX = (
    "Start a tracking server that every node can reach (e.g. `mlflow server --backend-store-uri "
    "sqlite:///mlflow.db --host 0.0.0.0 --port 5000`) and pass --tracking-uri http://<host>:5000 "
    "(or set tracking.uri in the study)."
)


def check_uri(uri: str, *, multi_node: bool) -> None:
    """Refuse a machine-local store when workers run on several nodes."""
    if multi_node and is_local_store(uri):
        raise TrackingError(
            f"the tracking store {uri} is a file on this machine, but the Ray cluster has several "
            f"nodes: workers on the other nodes cannot reach it. {_SERVER_FIX}"
        )


def check_cluster_uri(uri: str, address: str) -> None:
    """Refuse a machine-local store for a Ray cluster that ablate did not start on this machine
    (``--address``): however many nodes it has now, a worker may run on one (or on one that an
    autoscaler adds) that cannot reach the file, and then every cell fails."""
    if is_local_store(uri):
        raise TrackingError(
            f"the tracking store {uri} is a file on this machine, but --address {address} names "
            "a Ray cluster that ablate did not start here: its workers may run on other nodes "
            "(now, or added later by an autoscaler), which cannot reach the file, and every cell "
            f"would fail. {_SERVER_FIX}"
        )


def sqlite_path(uri: str) -> Path | None:
    """The database file of a sqlite:/// URI; None for other schemes."""
    if urlparse(uri).scheme != "sqlite":
        return None
    from sqlalchemy.engine import make_url

    try:
        database = make_url(uri).database
    except Exception as e:  # sqlalchemy's ArgumentError for a malformed URL
        raise TrackingError(f"the tracking URI {uri!r} is not a valid sqlite URL ({e})") from None
    if not database or database == ":memory:":
        raise TrackingError(f"the tracking URI {uri} names no database file")
    return Path(database).resolve()


def check_sqlite_file(
    path: Path,
    *,
    what: str = "the tracking store",
    fix: str = "move it aside to record the study anew",
) -> set[str]:
    """The names of the tables in the SQLite file at ``path``, its schema read once through a
    read-only connection (a millisecond; nothing written, nothing created); ``DamagedStoreError``
    naming it as ``what`` (and saying ``fix``) when it is there, not empty, and not a database
    SQLite can read (another file, truncated, malformed). A missing or empty file gives no table
    (``Client``'s ``must_exist`` and ``prepare_store`` decide what that means), and so does a
    store that is busy (``Client`` retries it)."""
    if _empty(path):
        return set()
    try:
        with contextlib.closing(read_only(path, timeout=5)) as db:
            rows = db.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    except sqlite3.OperationalError:  # missing, locked, or cannot be opened: not a sign of damage
        return set()
    except sqlite3.DatabaseError as e:
        raise _damaged(path, e, what=what, fix=fix) from None
    return {name for (name,) in rows}


def _damaged(
    path: Path | None,
    e: Exception,
    *,
    what: str = "the tracking store",
    fix: str = "move it aside to record the study anew",
) -> DamagedStoreError:
    return DamagedStoreError(
        f"{what} {path} is damaged or not a SQLite database ({e}); nothing was read or written: "
        f"restore it from a copy, or {fix}"
    )


def check_store(uri: str, *, create: bool = True) -> None:
    """Refuse a store that ``prepare_store`` could not use, writing nothing: an unsupported scheme,
    a SQLite URI that names no file (``:memory:`` lives in one process; workers are others), a
    SQLite folder that cannot be created, a SQLite file that is damaged (``check_sqlite_file``),
    or a server that does not answer (one request, 5 s at most, never the retries). ``create``:
    False for a store that is only read (``baseline_from``'s), whose folder need not be writable."""
    scheme = urlparse(uri).scheme
    if scheme == "sqlite":
        path = sqlite_path(uri)
        assert path is not None
        folder = next((p for p in (path.parent, *path.parents) if p.exists()), None)
        writable = folder is not None and folder.is_dir() and os.access(folder, os.W_OK)
        if create and not writable:
            raise TrackingError(
                f"the tracking store {path} cannot be created: {folder} is not a writable folder"
            )
        check_sqlite_file(path)
    elif scheme in ("http", "https"):
        try:
            urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=5).close()
        except urllib.error.HTTPError as e:  # it answers; only a 5xx means it is not working
            if e.code >= 500:
                raise TrackingError(f"the tracking server {uri} answers HTTP {e.code}") from e
        except (urllib.error.URLError, OSError) as e:
            raise TrackingError(
                f"no MLflow tracking server answers at {uri} ({e}); start one with `mlflow server "
                "--host 0.0.0.0 --port 5000` or fix the URI"
            ) from e
    else:
        raise TrackingError(
            f"unsupported tracking URI {uri!r}: use sqlite:///<path>/mlflow.db (one machine) or "
            "http(s)://<host>:<port> (an `mlflow server`)"
        )


def prepare_store(uri: str, output_dir: str | Path) -> None:
    """Create the store (driver only, before any worker starts), after ``check_store``."""
    check_store(uri)
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    path = sqlite_path(uri)
    if path is not None:
        # The first client on a new file runs MLflow's schema migrations (a few seconds); doing it
        # here keeps workers from racing to migrate the same file, and the folder's lock keeps two
        # drivers that start at once on one new file from doing so (both would fail, and leave a
        # half-migrated file).
        with _folder_locked(path):
            if not path.exists():
                new_sqlite_store(path)
            Client(uri).search_experiments(max_results=1)


def prepare_served_store(uri: str) -> None:
    """A new SQLite store at ``uri`` for the tracking server that will serve it (``ablate slurm
    run``), made from the template as ``prepare_store`` makes one, so that the server starts
    without running MLflow's migrations (3-4 s of CPU at its start); its default experiment's
    artifacts where the server puts them (``mlflow-artifacts:/0``). Nothing where the file is there
    already, or ``uri`` names no SQLite file: the server then creates or opens it as before."""
    path = sqlite_path(uri)
    if path is None:
        return
    with _folder_locked(path):
        if not path.exists():
            new_sqlite_store(path, location="mlflow-artifacts:/0")


@contextlib.contextmanager
def _folder_locked(path: Path) -> Iterator[None]:
    """``path``'s folder (made if missing) locked (``flock``) against other processes that make
    a store in it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        fcntl.flock(folder, fcntl.LOCK_EX)
        yield
    finally:
        os.close(folder)  # releases the lock


def new_sqlite_store(path: Path, location: str | None = None) -> None:
    """A new, empty SQLite store at ``path`` (absent), in milliseconds: a copy of the empty store
    that MLflow's own migrations built once per MLflow version (``_store_template``), its default
    experiment then given the location MLflow gives it (``location``; by default a client's,
    ``<cwd>/mlruns/0``) and the time now. MLflow migrates a new file through every revision of its
    schema, 1-2 s each time. Where the template cannot be had or fails its checks, nothing is
    copied: MLflow creates the store itself."""
    template = _store_template()
    if template is None:
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}.new")
    try:
        shutil.copyfile(template, tmp)
        now = int(time.time() * 1000)
        location = location or str(Path.cwd().resolve() / "mlruns" / "0")
        with contextlib.closing(sqlite3.connect(tmp)) as db, db:
            db.execute(
                "UPDATE experiments SET artifact_location = ?, creation_time = ?, "
                "last_update_time = ? WHERE experiment_id = 0",
                (location, now, now),
            )
        os.replace(tmp, path)
    except (OSError, sqlite3.Error):
        with contextlib.suppress(OSError):
            tmp.unlink()


def _store_template() -> Path | None:
    """The empty store of this MLflow version under ``$ABLATE_CACHE_DIR`` (default
    ``~/.cache/ablate``), built by MLflow the first time; None where it cannot be built. A file
    found there is checked (SQLite's integrity check, MLflow's schema revision, the default
    experiment) and rebuilt when it fails."""
    import mlflow

    folder = cache_dir() / "mlflow-store" / mlflow.__version__
    template = folder / "empty.db"
    try:
        if template.is_file() and _template_ok(template):
            return template
        folder.mkdir(parents=True, exist_ok=True)
        build = Path(tempfile.mkdtemp(prefix=".build-", dir=folder))  # a path MLflow never saw
        try:
            from mlflow.tracking import MlflowClient

            MlflowClient(tracking_uri=f"sqlite:///{build / 'empty.db'}").search_experiments()
            if not _template_ok(build / "empty.db"):
                return None
            os.replace(build / "empty.db", template)  # atomic: a racing builder's is as good
        finally:
            shutil.rmtree(build, ignore_errors=True)
    except Exception:  # any failure: MLflow creates the store itself
        return None
    return template


def _template_ok(path: Path) -> bool:
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
            ok = db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
            revision = db.execute("SELECT version_num FROM alembic_version").fetchall()
            default = db.execute("SELECT name FROM experiments").fetchall()
            runs = db.execute("SELECT COUNT(*) FROM runs").fetchone()
    except sqlite3.Error:
        return False
    return ok and revision == [(_schema_head(),)] and default == [("Default",)] and runs == (0,)


def _schema_head() -> str | None:
    """The schema revision this MLflow migrates a store to (None where it cannot say: then no
    template passes its check, and MLflow creates each store)."""
    try:
        from mlflow.store.db.utils import _get_latest_schema_revision

        return str(_get_latest_schema_revision())
    except Exception:
        return None


class Client:
    """An MlflowClient whose every call retries while the store is busy (see ``_retry``)."""

    def __init__(self, uri: str, *, must_exist: bool = False) -> None:
        path = sqlite_path(uri)
        # MLflow silently creates an empty database at a missing path, and builds one in an empty
        # file; a reader must do neither. Asked before MLflow is imported (seconds of CPU):
        # `ablate validate` and `plan` of a study that has recorded nothing yet never need it.
        if must_exist and path is not None and (not path.is_file() or _empty(path)):
            raise MissingStoreError(
                f"no MLflow store at {path}{' (an empty file)' if path.is_file() else ''}: run "
                "the study first (`ablate run`), or pass the --tracking-uri that it used"
            )
        if path is not None:  # MLflow's own error for a damaged file is a traceback
            check_sqlite_file(path)
        from mlflow.tracking import MlflowClient

        self.uri = uri
        self.path = path
        # Constructing the client opens the store (reads its schema): retried like any call.
        self.mlflow = self._call(f"opening {uri}", MlflowClient, tracking_uri=uri)

    def _call(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``_retry``, with a SQLite file found damaged midway refused as ``check_sqlite_file``
        refuses it."""
        try:
            return _retry(what, fn, *args, **kwargs)
        except Exception as e:
            if self.path is not None and type(e).__name__ == "DatabaseError":  # not Operational
                raise _damaged(self.path, getattr(e, "orig", None) or e) from None
            raise

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self.mlflow, name)
        return lambda *args, **kwargs: self._call(
            f"MLflow's {name} on {self.uri}", method, *args, **kwargs
        )

    def download_artifacts(self, run_id: str, path: str, dst_path: str) -> str:
        """MLflow's, without the progress bar MLflow draws on stderr for every download (a file
        of a few hundred bytes among ablate's one-line messages): off unless the user set
        ``MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR``."""
        mine = PROGRESS_BAR not in os.environ
        if mine:
            os.environ[PROGRESS_BAR] = "false"
        try:
            what = f"MLflow's download_artifacts on {self.uri}"
            return self._call(what, self.mlflow.download_artifacts, run_id, path, dst_path)
        finally:
            if mine:
                os.environ.pop(PROGRESS_BAR, None)


PROGRESS_BAR = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"


def _empty(path: Path) -> bool:
    try:
        return path.stat().st_size == 0
    except OSError:
        return False


def _is_transient(e: Exception) -> bool:
    from mlflow.exceptions import MlflowException

    if "database is locked" in str(e) or isinstance(e, ConnectionError | TimeoutError):
        return True
    if isinstance(e, MlflowException):  # SQLite's OperationalError arrives as a 503
        return e.get_http_status_code() >= 500 or e.error_code == "REQUEST_LIMIT_EXCEEDED"
    return type(e).__name__ == "OperationalError"  # sqlalchemy's or sqlite3's


def _retry(what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)``, retried with exponential backoff while the store is busy."""
    from mlflow.exceptions import MlflowException

    deadline = time.monotonic() + _RETRY_S
    delay = 0.05
    while True:
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            if _interrupted(e):
                break  # given back below, once the except clause has let go of ``e``
            transient = _is_transient(e)
            if transient and time.monotonic() + delay < deadline:
                time.sleep(delay * random.uniform(0.5, 1.5))  # jitter: writers do not re-collide
                delay = min(2 * delay, 5.0)
                continue
            if transient:
                raise TrackingError(
                    f"{what} still fails after {_RETRY_S:.0f} s of retries ({e}); the tracking "
                    "store is overloaded or unreachable"
                ) from e
            if isinstance(e, MlflowException):
                raise TrackingError(f"{what} failed: {e.message}") from e
            raise
    # Ctrl-C came inside the store's write, and the rollback that followed failed ("database is
    # locked"), which took its place: the interrupted connection, kept alive by the exception's
    # frames, holds SQLite's write lock until it is collected. Give the Ctrl-C back, once those
    # frames are gone, so that what the caller writes on its way out (interrupted cells, a
    # released lock) is not locked out for the retries' 120 s.
    gc.collect()
    raise KeyboardInterrupt


def _interrupted(e: BaseException) -> bool:
    """Whether a ``KeyboardInterrupt`` is in ``e``'s chain (its cause or the context it was raised
    in): SQLAlchemy and MLflow may turn a Ctrl-C inside a statement into another error."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, KeyboardInterrupt):
            return True
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return False


def read_only(path: Path, timeout: float = 60) -> sqlite3.Connection:
    """A connection that cannot write (nor create the file); it waits while a writer commits."""
    return sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, timeout=timeout)


def chunks(items: Sequence[T], n: int) -> list[Sequence[T]]:
    return [items[i : i + n] for i in range(0, len(items), n)]


def sqlite_start_clock(path: Path, run_id: str, start_ms: int) -> None:
    """Set a run's start time in a SQLite store: the driver creates every cell's run when the study
    starts, and MLflow has no call that moves a run's start, so without this a cell's Duration in
    the UI would include the time it waited in the queue. The one write that goes around MLflow's
    client (``tests/ablate/tracking/test_tracking.py`` pins the column it writes)."""
    with contextlib.closing(sqlite3.connect(path, timeout=60)) as db, db:
        db.execute("UPDATE runs SET start_time=? WHERE run_uuid=?", (start_ms, run_id))


def sqlite_move_artifacts(path: Path, old_root: str, new_root: str) -> int:
    """Point every experiment and run whose artifacts lay under ``old_root`` (a file URI) at
    ``new_root`` instead, in a SQLite store; returns how many rows changed. MLflow stores artifact
    locations as absolute URIs and has no call that changes them: a study folder that was moved or
    copied would otherwise show its runs with artifact links into the old place."""
    old, new = old_root.rstrip("/") + "/", new_root.rstrip("/") + "/"
    with contextlib.closing(sqlite3.connect(path, timeout=60)) as db, db:
        n = 0
        for table, column in (("experiments", "artifact_location"), ("runs", "artifact_uri")):
            n += db.execute(
                f"UPDATE {table} SET {column} = ? || substr({column}, ?) "
                f"WHERE {column} = ? OR substr({column}, 1, ?) = ?",
                (new.rstrip("/"), len(old), old.rstrip("/"), len(old), old),
            ).rowcount
        return n


def sqlite_points(
    db: sqlite3.Connection, run_id: str, key: str | None = None
) -> list[tuple[str, int, int, float, bool]]:
    """(key, step, timestamp, value, is_nan) of every point of one run (of one key), by step.

    The one place that reads MLflow's SQL schema (see the module docstring for why).
    """
    sql = "SELECT key, step, timestamp, value, is_nan FROM metrics WHERE run_uuid=?"
    args: tuple[str, ...] = (run_id,)
    if key is not None:
        sql += " AND key=?"
        args = (run_id, key)
    rows = db.execute(sql + " ORDER BY step", args).fetchall()
    return [(k, int(s), int(t), float(v), bool(nan)) for k, s, t, v, nan in rows]
