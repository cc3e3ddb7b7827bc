"""A stand-in for the Hugging Face Hub's HTTP API, so tests run the real huggingface_hub client offline.

`FakeHub` serves model repos built from local directories on http://127.0.0.1:<port>, in the hub's URL
layout and with the headers and JSON fields huggingface_hub 1.33 reads:

    GET       /api/models/{repo}[/revision/{rev}][?blobs=true]      HfApi.model_info / repo_info
    GET       /api/models/{repo}/tree/{rev}[/{path}][?recursive=true]  HfApi.list_repo_tree
    HEAD, GET /{repo}/resolve/{rev}/{filename}                      hf_hub_download
    HEAD, GET /cdn-lfs/{sha256}                                     where LFS files redirect to

A test serves a directory and runs the client in a subprocess pointed at the server:

    with FakeHub() as hub:
        sha = hub.add_repo("org/tiny", model_dir)           # one commit; `main` points at it
        env = hub.client_env(tmp_path / "hf")                # HF_ENDPOINT, a fresh HF_HOME, online
        subprocess.run([sys.executable, "-c", code], env=env, check=True)
        seen = len(hub.requests)                              # "METHOD /path?query", one per request
        ...                                                   # run again: a cached commit sha makes no request
    # after `with`, the port is closed: what the client does when the hub is unreachable

Why a subprocess: huggingface_hub reads HF_ENDPOINT, HF_HUB_OFFLINE, HF_HOME and HF_HUB_CACHE once, when
it is imported, into `huggingface_hub.constants` (ENDPOINT, and the HUGGINGFACE_CO_URL_TEMPLATE that
hf_hub_download builds file URLs from). Setting os.environ after the import changes nothing, and
tests/conftest.py defaults HF_HUB_OFFLINE to 1 for the whole test process; `client_env` drops it (and any
HF_TOKEN). In-process use needs monkeypatching of constants.ENDPOINT, constants.HUGGINGFACE_CO_URL_TEMPLATE
(= endpoint + "/{repo_id}/resolve/{revision}/{filename}") and constants.HF_HUB_OFFLINE, plus cache_dir=;
and constants.HF_HUB_DISABLE_TELEMETRY=True to keep GET /api/agent-harnesses out of `requests`.

How it answers, as the real hub does:
- A revision is a branch, a tag or a full commit sha of the repo. Commit shas are real git ids (blob ->
  tree -> commit, fixed author and date), so the same files always give the same sha.
- `*.safetensors` are LFS files: listed with `lfs` {sha256, size, pointerSize} and the git id of their
  LFS pointer; resolve answers 302 to the CDN (ETag and X-Linked-Etag = sha256, X-Linked-Size = size).
  Other files are git blobs: ETag = git blob sha1, served with 200 and Content-Length. Every resolve
  answer carries X-Repo-Commit.
- Errors carry X-Error-Code, which hf_raise_for_status maps to exceptions:
    unknown repo     401 RepoNotFound (anonymous) / 404 with a token  -> RepositoryNotFoundError
    unknown revision 404 RevisionNotFound                              -> RevisionNotFoundError
    missing file     404 EntryNotFound (+ X-Repo-Commit)               -> RemoteEntryNotFoundError
    gated repo file  401 GatedRepo (anonymous) / 403 (wrong token)     -> GatedRepoError
  A gated repo's metadata (model_info, tree) stays public, like the hub's; only its files are refused
  without `Authorization: Bearer <token>`.
- No xet: no X-Xet-Hash header and no `xetHash` in listings, so the client takes the plain HTTP download
  path even though hf_xet is installed (HF_HUB_DISABLE_XET is not needed).

What the real client does with it (huggingface_hub 1.33.0, measured), worth knowing when writing asserts:
- snapshot_download(revision=<sha>) of a cached commit makes no request; revision="main" makes one
  (GET /api/models/{repo}/revision/main). The listing is cached per commit in trees/<sha>.json.
- refs/<name> is written only by a download that names a branch or tag; model_info writes nothing. So
  model_info + snapshot_download(revision=<sha>) leaves no refs/main, and an offline
  snapshot_download(revision="main") then raises LocalEntryNotFoundError.
- With the port closed: model_info and snapshot_download(revision=<sha>) raise httpx.ConnectError at once,
  snapshot_download(revision="main") LocalEntryNotFoundError at once; hf_hub_download (so transformers'
  from_pretrained by repo id) retries 5 times (1+2+4+8+8 s) and raises LocalEntryNotFoundError after ~23 s.

Uploads, as `HfApi.create_repo` and `upload_folder` make them without hf_xet (HF_HUB_DISABLE_XET=1: the
Xet storage protocol has no stand-in here), each refused with 401 unless it carries the `write_token`
given to FakeHub (but the LFS PUT, which goes to a pre-signed storage URL, as on the Hub):

    POST      /api/repos/create                                      create_repo (409 when it exists)
    POST      /api/validate-yaml                                     README.md's metadata, before a commit
    POST      /api/models/{repo}/preupload/{rev}                     which files go to LFS
    POST      /{repo}.git/info/lfs/objects/batch                     LFS upload actions (basic transfer)
    PUT       /lfs-upload/{sha256}, POST /lfs-verify                 the LFS object itself, then its check
    POST      /api/models/{repo}/commit/{rev}                        the NDJSON commit: a new commit on rev

A commit keeps the files of the commit it extends and adds its own, so what was uploaded downloads back
through the routes above. `uploads` lists (repo, path) of every file committed.

Not served: datasets and spaces, `expand`, pagination (listings come in one page), Range requests,
multipart LFS uploads. Files are read from `files_dir` when requested: leave the directory unchanged while
served.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import threading
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".gguf")
# LFS downloads leave the hub for a CDN on another host; the client then reads the file's metadata from
# the 302 itself and drops the Authorization header. "localhost" reaches this server under another name.
CDN_HOST = "localhost"
COMMIT_DATE = "2025-01-01T00:00:00.000Z"
_COMMIT_AUTHOR = "FakeHub <fakehub@localhost> 1735689600 +0000"
# Variables that would make a client subprocess offline, authenticated or use another cache.
_CLIENT_ENV_DROP = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN",
                    "HF_OIDC_RESOURCE", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_TOKEN_PATH")

_REPO = r"(?P<repo>[\w.-]+(?:/[\w.-]+)?)"
_REV = r"(?P<rev>[^/]+)"  # the client percent-encodes revisions, "/" included (refs%2Fpr%2F1)
_ROUTES = [
    ("info", re.compile(rf"^/api/models/{_REPO}(?:/revision/{_REV})?$")),
    ("tree", re.compile(rf"^/api/models/{_REPO}/tree/{_REV}(?:/(?P<path>.*))?$")),
    ("resolve", re.compile(rf"^/{_REPO}/resolve/{_REV}/(?P<path>.+)$")),
    ("cdn", re.compile(r"^/cdn-lfs/(?P<sha256>[0-9a-f]{64})$")),
]
_UPLOAD_ROUTES = [
    ("create_repo", re.compile(r"^/api/repos/create$")),
    ("validate_yaml", re.compile(r"^/api/validate-yaml$")),
    ("preupload", re.compile(rf"^/api/models/{_REPO}/preupload/{_REV}$")),
    ("lfs_batch", re.compile(rf"^/{_REPO}\.git/info/lfs/objects/batch$")),
    ("lfs_upload", re.compile(r"^/lfs-upload/(?P<sha256>[0-9a-f]{64})$")),
    ("lfs_verify", re.compile(r"^/lfs-verify$")),
    ("commit", re.compile(rf"^/api/models/{_REPO}/commit/{_REV}$")),
]


# --- Repos as git stores them ------------------------------------------------------------------

@dataclass(frozen=True)
class _File:
    disk: Path
    size: int
    oid: str  # git blob id: of the content, or of the LFS pointer for an LFS file
    sha256: str
    pointer_size: int | None  # set for LFS files only

    @property
    def is_lfs(self) -> bool:
        return self.pointer_size is not None

    @property
    def etag(self) -> str:
        return self.sha256 if self.is_lfs else self.oid


@dataclass
class _Repo:
    refs: dict[str, str] = field(default_factory=dict)  # branch or tag -> commit sha
    commits: dict[str, dict[str, _File]] = field(default_factory=dict)  # sha -> repo path -> file
    trees: dict[str, dict[str, str]] = field(default_factory=dict)  # sha -> directory ("" = root) -> tree id
    gated: bool = False
    token: str | None = None


def _git_oid(kind: str, body: bytes) -> str:
    return hashlib.sha1(f"{kind} {len(body)}\0".encode() + body).hexdigest()


def _hash_file(path: Path, size: int) -> tuple[str, str]:
    """(git blob sha1, sha256) of a file, read once in chunks: weights can be large."""
    sha1, sha256 = hashlib.sha1(f"blob {size}\0".encode()), hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            sha1.update(chunk)
            sha256.update(chunk)
    return sha1.hexdigest(), sha256.hexdigest()


def _lfs_pointer(sha256: str, size: int) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


def _scan(root: Path) -> dict[str, _File]:
    files = {}
    for disk in sorted(p for p in root.rglob("*") if p.is_file()):
        size = disk.stat().st_size
        oid, sha256 = _hash_file(disk, size)
        pointer_size = None
        if disk.name.endswith(LFS_SUFFIXES):  # git stores the LFS pointer; the hub lists the pointer's blob id
            pointer = _lfs_pointer(sha256, size)
            oid, pointer_size = _git_oid("blob", pointer), len(pointer)
        files[disk.relative_to(root).as_posix()] = _File(disk, size, oid, sha256, pointer_size)
    return files


def _tree_oids(files: dict[str, _File]) -> dict[str, str]:
    """The git tree id of every directory ("" is the root), computed as git does."""
    dirs = {""}
    for path in files:
        parts = path.split("/")[:-1]
        dirs.update("/".join(parts[: i + 1]) for i in range(len(parts)))
    entries: dict[str, dict[str, tuple[bytes, str]]] = {d: {} for d in dirs}  # dir -> name -> (mode, id)
    for path, file in files.items():
        parent, _, name = path.rpartition("/")
        entries[parent][name] = (b"100644", file.oid)
    oids = {}
    for d in sorted(dirs, key=lambda d: d.count("/") + bool(d), reverse=True):  # children before parents
        # git orders entries by name, a directory's name compared as if it ended with "/"
        items = sorted(entries[d].items(), key=lambda kv: kv[0].encode() + (b"/" if kv[1][0] == b"40000" else b""))
        oids[d] = _git_oid("tree", b"".join(mode + b" " + name.encode() + b"\0" + bytes.fromhex(oid)
                                            for name, (mode, oid) in items))
        if d:
            parent, _, name = d.rpartition("/")
            entries[parent][name] = (b"40000", oids[d])
    return oids


def _commit_oid(tree: str) -> str:
    return _git_oid("commit", f"tree {tree}\nauthor {_COMMIT_AUTHOR}\ncommitter {_COMMIT_AUTHOR}\n\nUpload folder\n"
                    .encode())


# --- JSON the client parses ----------------------------------------------------------------------

def _sibling(path: str, file: _File, blobs: bool) -> dict:
    """A `siblings` entry of model_info; sizes and hashes only with ?blobs=true (files_metadata=True)."""
    if not blobs:
        return {"rfilename": path}
    entry = {"rfilename": path, "blobId": file.oid, "size": file.size}
    if file.is_lfs:
        entry["lfs"] = {"sha256": file.sha256, "size": file.size, "pointerSize": file.pointer_size}
    return entry


def _tree_file(path: str, file: _File) -> dict:
    entry = {"type": "file", "oid": file.oid, "size": file.size, "path": path}
    if file.is_lfs:  # the tree endpoint names the sha256 `oid`, model_info names it `sha256`
        entry["lfs"] = {"oid": file.sha256, "size": file.size, "pointerSize": file.pointer_size}
    return entry


def _listed(path: str, base: str, recursive: bool) -> bool:
    prefix = f"{base}/" if base else ""
    return path.startswith(prefix) and path != base and (recursive or "/" not in path[len(prefix):])


class _HubError(Exception):
    def __init__(self, status: int, code: str | None, message: str, headers: dict | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers or {}


# --- The server ------------------------------------------------------------------------------------

class FakeHub:
    """Model repos served over HTTP like huggingface.co; a context manager that starts and stops it."""

    def __init__(self, write_token: str | None = None):
        self._repos: dict[str, _Repo] = {}
        self._lfs: dict[str, _File] = {}  # sha256 -> file: the CDN is content-addressed
        self.requests: list[str] = []  # "METHOD /path?query" of every request, in arrival order
        self.write_token = write_token  # uploads carry it as `Authorization: Bearer <token>`, or get 401
        self.uploads: list[tuple[str, str]] = []  # (repo, path) of every file committed
        self._upload_dir: Path | None = None  # where uploaded files live while served
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.port: int | None = None

    @property
    def endpoint(self) -> str:
        """http://127.0.0.1:<port>; kept after stop() so a test can point a client at the closed port."""
        if self.port is None:
            raise RuntimeError("FakeHub is not started")
        return f"http://127.0.0.1:{self.port}"

    def add_repo(self, repo_id: str, files_dir: Path, *, branches: Iterable[str] = ("main",),
                 tags: Iterable[str] = (), gated: bool = False, token: str | None = None) -> str:
        """Serve every file under `files_dir` as one commit of model repo `repo_id`; return its sha.

        `branches` and `tags` name the refs that point at this commit (moved there if they pointed
        elsewhere), so adding a second directory with branches=("main",) is a push to main, and with
        branches=("dev",) a second branch. A gated repo refuses its files unless the request carries
        `Authorization: Bearer <token>`; gated/token apply to the whole repo, the last call's values win.
        """
        files = _scan(Path(files_dir))
        if not files:
            raise ValueError(f"{files_dir}: no files to serve")
        trees = _tree_oids(files)
        sha = _commit_oid(trees[""])
        repo = self._repos.setdefault(repo_id, _Repo())
        repo.commits[sha], repo.trees[sha] = files, trees
        repo.refs.update({ref: sha for ref in (*branches, *tags)})
        repo.gated, repo.token = gated, token
        self._lfs.update({f.sha256: f for f in files.values() if f.is_lfs})
        return sha

    def client_env(self, hf_home: Path, **extra: str) -> dict[str, str]:
        """os.environ for a client subprocess: this endpoint, an own HF_HOME, online and anonymous.

        HF_HUB_DISABLE_TELEMETRY=1 because otherwise each process's first request is preceded by
        GET /api/agent-harnesses (huggingface_hub names the calling AI agent in its user agent), which
        would show in `requests`.
        """
        env = {k: v for k, v in os.environ.items() if k not in _CLIENT_ENV_DROP}
        env.update(HF_ENDPOINT=self.endpoint, HF_HOME=str(hf_home), HF_HUB_DISABLE_TELEMETRY="1", **extra)
        return env

    def start(self) -> FakeHub:
        import tempfile

        self._upload_dir = Path(tempfile.mkdtemp(prefix="fakehub-"))
        handler = type("Handler", (_Handler,), {"hub": self})
        self._server = _Server(("127.0.0.1", 0), handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="FakeHub", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join()
            self._server = self._thread = None
        if self._upload_dir is not None:
            shutil.rmtree(self._upload_dir, ignore_errors=True)
            self._upload_dir = None

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def repo_files(self, repo_id: str, rev: str = "main") -> dict[str, bytes]:
        """Every file of a repo at `rev` (a branch, tag or commit), read back: what a download would give."""
        repo = self._repos[repo_id]
        return {path: file.disk.read_bytes() for path, file in repo.commits[repo.refs.get(rev, rev)].items()}

    def _commit(self, repo_id: str, rev: str, added: dict[str, _File]) -> str:
        """A new commit on branch `rev`: the files of the commit it points at, with `added` on top."""
        repo = self._repos[repo_id]
        files = {**(repo.commits[repo.refs[rev]] if rev in repo.refs else {}), **added}
        trees = _tree_oids(files)
        sha = _commit_oid(trees[""])
        repo.commits[sha], repo.trees[sha] = files, trees
        repo.refs[rev] = sha
        self._lfs.update({f.sha256: f for f in files.values() if f.is_lfs})
        self.uploads += [(repo_id, path) for path in added]
        return sha

    def _lookup(self, repo_id: str, rev: str, token: str | None, *, files: bool) -> tuple[_Repo, str]:
        """The repo and the commit `rev` names, or the error the hub answers instead."""
        repo = self._repos.get(repo_id)
        if repo is None:  # the hub hides whether a repo exists from anonymous callers: 401, not 404
            if token is None:
                raise _HubError(401, "RepoNotFound", "Invalid username or password.")
            raise _HubError(404, "RepoNotFound", "Repository not found")
        if files and repo.gated and (token is None or token != repo.token):
            if token is None:
                raise _HubError(401, "GatedRepo", f"Access to model {repo_id} is restricted. You must have access "
                                "to it and be authenticated to access it. Please log in.")
            raise _HubError(403, "GatedRepo", f"Access to model {repo_id} is restricted and you are not in the "
                            f"authorized list. Visit {self.endpoint}/{repo_id} to ask for access.")
        sha = repo.refs.get(rev, rev if rev in repo.commits else None)
        if sha is None:
            raise _HubError(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        return repo, sha


class _Server(ThreadingHTTPServer):
    request_queue_size = 64  # snapshot_download opens 8 connections at once; the default backlog is 5
    daemon_threads = True


class _Handler(BaseHTTPRequestHandler):
    # HTTP/1.0: one request per connection, so once stop() returns no kept-alive connection answers.
    protocol_version = "HTTP/1.0"
    server_version = "FakeHub"
    hub: FakeHub

    def do_GET(self):
        self._serve()

    def do_HEAD(self):
        self._serve()

    def do_POST(self):
        self.hub.requests.append(f"{self.command} {self.path}")
        url = urlsplit(self.path)
        for name, pattern in _UPLOAD_ROUTES:
            if match := pattern.match(url.path):
                args = {k: unquote(v) for k, v in match.groupdict().items() if v is not None}
                try:  # an LFS upload goes to the storage's pre-signed URL, without the token (as to S3)
                    if name != "lfs_upload" and (self.hub.write_token is None or self._token() != self.hub.write_token):
                        raise _HubError(401, "Unauthorized", "Invalid credentials in Authorization header")
                    getattr(self, f"_{name}")(self._body(), **args)
                except _HubError as err:
                    self._send_json(err.status, {"error": err.message}, err.headers,
                                    {"X-Error-Code": err.code, "X-Error-Message": err.message})
                return
        self._send_json(405, {"error": f"FakeHub does not serve {self.command} {url.path}"})

    do_PUT = do_DELETE = do_PATCH = do_POST

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while (size := int(self.rfile.readline().strip() or b"0", 16)) > 0:
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            self.rfile.readline()
            return b"".join(chunks)
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def log_message(self, format, *args):  # tests read hub.requests, not stderr
        pass

    def _serve(self) -> None:
        self.hub.requests.append(f"{self.command} {self.path}")
        url = urlsplit(self.path)
        for name, pattern in _ROUTES:
            if match := pattern.match(url.path):
                args = {k: unquote(v) for k, v in match.groupdict().items() if v is not None}
                try:
                    getattr(self, f"_{name}")(parse_qs(url.query), **args)
                except _HubError as err:
                    self._send_json(err.status, {"error": err.message}, err.headers,
                                    {"X-Error-Code": err.code, "X-Error-Message": err.message})
                except (BrokenPipeError, ConnectionResetError):  # the client gave up mid-file
                    pass
                return
        self._send_json(404, {"error": "Not Found"})

    def _token(self) -> str | None:
        auth = self.headers.get("Authorization", "")
        return auth[len("Bearer "):] if auth.startswith("Bearer ") else None

    # --- routes ---

    def _info(self, query: dict, repo: str, rev: str = "main") -> None:
        found, sha = self.hub._lookup(repo, rev, self._token(), files=False)
        files = found.commits[sha]
        blobs = query.get("blobs", ["false"])[0].lower() == "true"
        self._send_json(200, {
            "_id": hashlib.sha1(repo.encode()).hexdigest()[:24], "id": repo, "modelId": repo,
            "author": repo.split("/")[0] if "/" in repo else None, "sha": sha,
            "lastModified": COMMIT_DATE, "createdAt": COMMIT_DATE, "private": False, "disabled": False,
            "gated": "manual" if found.gated else False, "downloads": 0, "likes": 0, "tags": [],
            "siblings": [_sibling(path, f, blobs) for path, f in files.items()], "spaces": [],
            "usedStorage": sum(f.size for f in files.values()),
        })

    def _tree(self, query: dict, repo: str, rev: str, path: str = "") -> None:
        found, sha = self.hub._lookup(repo, rev, self._token(), files=False)
        files, trees = found.commits[sha], found.trees[sha]
        base = path.strip("/")
        if base not in trees:
            raise _HubError(404, "EntryNotFound", f'{base} does not exist on "{rev}"', {"X-Repo-Commit": sha})
        recursive = query.get("recursive", ["false"])[0].lower() == "true"
        listing = [{"type": "directory", "oid": oid, "size": 0, "path": d}
                   for d, oid in trees.items() if _listed(d, base, recursive)]
        listing += [_tree_file(p, f) for p, f in files.items() if _listed(p, base, recursive)]
        self._send_json(200, sorted(listing, key=lambda e: e["path"]))

    def _resolve(self, query: dict, repo: str, rev: str, path: str) -> None:
        found, sha = self.hub._lookup(repo, rev, self._token(), files=True)
        file = found.commits[sha].get(path)
        if file is None:  # the client caches the miss under .no_exist/<X-Repo-Commit>/
            raise _HubError(404, "EntryNotFound", "Entry not found", {"X-Repo-Commit": sha})
        headers = {"X-Repo-Commit": sha, "ETag": f'"{file.etag}"'}
        if not file.is_lfs:
            self._send_file(file, headers)
            return
        location = f"http://{CDN_HOST}:{self.hub.port}/cdn-lfs/{file.sha256}"
        headers.update({"X-Linked-Etag": f'"{file.sha256}"', "X-Linked-Size": str(file.size), "Location": location})
        self._send(302, f"Found. Redirecting to {location}".encode(), "text/plain; charset=utf-8", headers)

    def _cdn(self, query: dict, sha256: str) -> None:
        file = self.hub._lfs.get(sha256)
        if file is None:
            self._send_json(404, {"error": "Not Found"})
        else:
            self._send_file(file, {"ETag": f'"{sha256}"'})

    # --- uploads ---

    def _create_repo(self, body: bytes) -> None:
        payload = json.loads(body)
        repo_id = "/".join(p for p in (payload.get("organization"), payload["name"]) if p)
        if repo_id in self.hub._repos:
            raise _HubError(409, "RepoExists", "You already created this model repo",
                            {"X-Error-Url": f"{self.hub.endpoint}/{repo_id}"})
        self.hub._repos[repo_id] = _Repo()
        self._send_json(200, {"url": f"{self.hub.endpoint}/{repo_id}", "name": repo_id})

    def _validate_yaml(self, body: bytes) -> None:
        self._send_json(200, {"errors": [], "warnings": []})

    def _preupload(self, body: bytes, repo: str, rev: str) -> None:
        if repo not in self.hub._repos:
            raise _HubError(404, "RepoNotFound", "Repository not found")
        files = json.loads(body)["files"]
        self._send_json(200, {"files": [{"path": f["path"], "shouldIgnore": False, "oid": None,
                                         "uploadMode": "lfs" if f["path"].endswith(LFS_SUFFIXES) else "regular"}
                                        for f in files]})

    def _lfs_batch(self, body: bytes, repo: str) -> None:
        objects = []
        for obj in json.loads(body)["objects"]:
            entry = {"oid": obj["oid"], "size": obj["size"], "authenticated": True}
            if obj["oid"] not in self.hub._lfs:  # a blob the hub has is not uploaded again
                entry["actions"] = {"upload": {"href": f"{self.hub.endpoint}/lfs-upload/{obj['oid']}"},
                                    "verify": {"href": f"{self.hub.endpoint}/lfs-verify"}}
            objects.append(entry)
        self._send_json(200, {"transfer": "basic", "objects": objects})

    def _lfs_upload(self, body: bytes, sha256: str) -> None:
        if hashlib.sha256(body).hexdigest() != sha256:
            raise _HubError(400, "BadRequest", "sha256 mismatch")
        disk = self.hub._upload_dir / "lfs" / sha256
        disk.parent.mkdir(parents=True, exist_ok=True)
        disk.write_bytes(body)
        pointer = _lfs_pointer(sha256, len(body))
        self.hub._lfs[sha256] = _File(disk, len(body), _git_oid("blob", pointer), sha256, len(pointer))
        self._send_json(200, {})

    def _lfs_verify(self, body: bytes) -> None:
        if json.loads(body)["oid"] not in self.hub._lfs:
            raise _HubError(404, "EntryNotFound", "LFS object not found")
        self._send_json(200, {})

    def _commit(self, body: bytes, repo: str, rev: str) -> None:
        import base64

        if repo not in self.hub._repos:
            raise _HubError(404, "RepoNotFound", "Repository not found")
        added = {}
        for line in body.splitlines():
            item = json.loads(line)
            value = item["value"]
            if item["key"] == "file":
                content = base64.b64decode(value["content"])
                disk = self.hub._upload_dir / "blobs" / hashlib.sha256(content).hexdigest()
                disk.parent.mkdir(parents=True, exist_ok=True)
                disk.write_bytes(content)
                added[value["path"]] = _File(disk, len(content), _git_oid("blob", content),
                                             hashlib.sha256(content).hexdigest(), None)
            elif item["key"] == "lfsFile":
                if value["oid"] not in self.hub._lfs:
                    raise _HubError(422, "BadRequest", f"LFS object {value['oid']} was not uploaded")
                added[value["path"]] = self.hub._lfs[value["oid"]]
            elif item["key"] != "header":
                raise _HubError(422, "BadRequest", f"FakeHub does not commit {item['key']}")
        sha = self.hub._commit(repo, rev, added)
        self._send_json(200, {"commitUrl": f"{self.hub.endpoint}/{repo}/commit/{sha}", "commitOid": sha,
                              "pullRequestUrl": None})

    # --- responses ---

    def _send(self, status: int, body: bytes, content_type: str, *header_sets: dict) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self._send_headers(*header_sets)
        if self.command != "HEAD":
            self.wfile.write(body)

    def _send_json(self, status: int, data, *header_sets: dict) -> None:
        self._send(status, json.dumps(data).encode(), "application/json; charset=utf-8", *header_sets)

    def _send_file(self, file: _File, headers: dict) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(file.size))
        self._send_headers(headers)
        if self.command != "HEAD":
            with file.disk.open("rb") as f:  # streamed: weights need not fit in memory
                shutil.copyfileobj(f, self.wfile, 1 << 20)

    def _send_headers(self, *header_sets: dict) -> None:
        # The hub names each request in its answer; errors raised by the client quote it.
        self.send_header("X-Request-Id", self.headers.get("X-Amzn-Trace-Id") or str(uuid.uuid4()))
        for headers in header_sets:
            for name, value in headers.items():
                self.send_header(name, value)
        self.end_headers()
