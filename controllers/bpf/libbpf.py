"""The patch panel's object loaded, and its maps written, through libbpf (ctypes).

A reconfiguration of the BPF panel is one map write whose times the kernel
enforces, so the write must cost a system call, not a process: ``bpftool map
update`` would fork and exec for every change.  libbpf.so.1 (Debian's
libbpf1, which libbpf-dev and bpftool pull in) loads the object and owns its
descriptors; the map calls here are its thin wrappers over ``bpf(2)``.

Nothing is pinned: each `PanelObject.load` creates the programs and a fresh
set of maps, which live while this process holds the object or a tc filter
uses a program, so a per-OCS map is one load per OCS.  A controller that
dies leaves its programs attached, and their maps with them: its successor
finds them from the filter (`maps_of_program`) and loads its object over
those maps (``reuse``), so the circuits go on as they were.

libbpf 1.x reports a failed call as NULL (pointers) or a negative errno
(integers), with errno set; ctypes keeps errno (``use_errno``) so the
messages name the kernel's reason.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno as errnos
import os
import threading
import weakref
from pathlib import Path
from typing import Dict, List, Optional, Tuple

BPF_ANY = 0
BPF_MAP_TYPE_ARRAY, BPF_MAP_TYPE_PERCPU_HASH, BPF_MAP_TYPE_PERCPU_ARRAY = 2, 5, 6
BPF_MAP_TYPE_LRU_PERCPU_HASH = 10
_PER_CPU = (BPF_MAP_TYPE_PERCPU_HASH, BPF_MAP_TYPE_PERCPU_ARRAY, BPF_MAP_TYPE_LRU_PERCPU_HASH)
_ARRAYS = (BPF_MAP_TYPE_ARRAY, BPF_MAP_TYPE_PERCPU_ARRAY)
ENOTSUPP = 524                  # the kernel's own "not supported" (not in userspace errno)

# The `stats` map's slots, in the order of panel.bpf.c's enum.
STATS = ("redirected", "dropped_dark", "dropped_no_entry", "passed")


class PanelError(RuntimeError):
    """The panel's object could not be loaded (``errno`` when the kernel said why)."""

    def __init__(self, message: str, errno: Optional[int] = None):
        super().__init__(message)
        self.errno = errno


class _TestRunOpts(ctypes.Structure):
    # struct bpf_test_run_opts of <bpf/bpf.h>, libbpf 1.1 (80 bytes)
    _fields_ = [("sz", ctypes.c_size_t),
                ("data_in", ctypes.c_void_p), ("data_out", ctypes.c_void_p),
                ("data_size_in", ctypes.c_uint32), ("data_size_out", ctypes.c_uint32),
                ("ctx_in", ctypes.c_void_p), ("ctx_out", ctypes.c_void_p),
                ("ctx_size_in", ctypes.c_uint32), ("ctx_size_out", ctypes.c_uint32),
                ("retval", ctypes.c_uint32), ("repeat", ctypes.c_int),
                ("duration", ctypes.c_uint32), ("flags", ctypes.c_uint32),
                ("cpu", ctypes.c_uint32), ("batch_size", ctypes.c_uint32)]


class _BatchOpts(ctypes.Structure):
    # struct bpf_map_batch_opts of <bpf/bpf.h>
    _fields_ = [("sz", ctypes.c_size_t), ("elem_flags", ctypes.c_uint64),
                ("flags", ctypes.c_uint64)]


class _SkBuff(ctypes.Structure):
    # The head of struct __sk_buff (<linux/bpf.h>) up to ifindex: a shorter ctx
    # is allowed, the kernel zeroes the rest.
    _fields_ = [(name, ctypes.c_uint32) for name in (
        "len", "pkt_type", "mark", "queue_mapping", "protocol", "vlan_present",
        "vlan_tci", "vlan_proto", "priority", "ingress_ifindex", "ifindex")]


class _MapInfo(ctypes.Structure):
    # The head of struct bpf_map_info; the kernel fills what fits.
    _fields_ = [(name, ctypes.c_uint32) for name in (
        "type", "id", "key_size", "value_size", "max_entries", "map_flags")] + \
        [("name", ctypes.c_char * 16)]


class _ProgInfo(ctypes.Structure):
    # The head of struct bpf_prog_info (<linux/bpf.h>), up to its map ids.
    _fields_ = [("type", ctypes.c_uint32), ("id", ctypes.c_uint32),
                ("tag", ctypes.c_uint8 * 8), ("jited_prog_len", ctypes.c_uint32),
                ("xlated_prog_len", ctypes.c_uint32), ("jited_prog_insns", ctypes.c_uint64),
                ("xlated_prog_insns", ctypes.c_uint64), ("load_time", ctypes.c_uint64),
                ("created_by_uid", ctypes.c_uint32), ("nr_map_ids", ctypes.c_uint32),
                ("map_ids", ctypes.c_uint64)]


_P, _I, _U32P = ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_uint32)
_PROTOTYPES = {
    # name: (restype, argtypes)
    "libbpf_get_error": (ctypes.c_long, [_P]),
    "bpf_object__open_file": (_P, [ctypes.c_char_p, _P]),
    "bpf_object__load": (_I, [_P]),
    "bpf_object__close": (None, [_P]),
    "bpf_object__find_program_by_name": (_P, [_P, ctypes.c_char_p]),
    "bpf_object__find_map_fd_by_name": (_I, [_P, ctypes.c_char_p]),
    "bpf_object__find_map_by_name": (_P, [_P, ctypes.c_char_p]),
    "bpf_map__reuse_fd": (_I, [_P, _I]),
    "bpf_prog_get_fd_by_id": (_I, [ctypes.c_uint32]),
    "bpf_map_get_fd_by_id": (_I, [ctypes.c_uint32]),
    "bpf_program__fd": (_I, [_P]),
    "bpf_map_update_elem": (_I, [_I, _P, _P, ctypes.c_uint64]),
    "bpf_map_update_batch": (_I, [_I, _P, _P, _U32P, _P]),
    "bpf_map_lookup_elem": (_I, [_I, _P, _P]),
    "bpf_map_delete_elem": (_I, [_I, _P]),
    "bpf_map_get_next_key": (_I, [_I, _P, _P]),
    "bpf_obj_get_info_by_fd": (_I, [_I, _P, _U32P]),
    "bpf_prog_test_run_opts": (_I, [_I, ctypes.POINTER(_TestRunOpts)]),
    "libbpf_num_possible_cpus": (_I, []),
    "libbpf_strerror": (_I, [_I, ctypes.c_char_p, ctypes.c_size_t]),
}

_lib = None
_lib_lock = threading.Lock()


def libbpf() -> ctypes.CDLL:
    """libbpf.so.1, its functions typed; `PanelError` when it is not there."""
    global _lib
    with _lib_lock:
        if _lib is None:
            name = ctypes.util.find_library("bpf") or "libbpf.so.1"
            try:
                lib = ctypes.CDLL(name, use_errno=True)
            except OSError as exc:
                raise PanelError(f"libbpf is not installed ({name}: {exc}); "
                                 "install libbpf1 (bootstrap.sh does)") from exc
            for function, (restype, argtypes) in _PROTOTYPES.items():
                try:
                    call = getattr(lib, function)
                except AttributeError as exc:
                    raise PanelError(f"{name} has no {function}: libbpf 1.0 or newer "
                                     "is needed") from exc
                call.restype, call.argtypes = restype, argtypes
            _lib = lib
    return _lib


def _errno(result: int) -> int:
    """The error of a failed int-returning call: errno, else the negative result."""
    return ctypes.get_errno() or -result or errnos.EIO


def _strerror(err: int) -> str:
    # libbpf's own codes (4000 and up: not an ELF object, no BTF, ...) are
    # unknown to os.strerror.
    buffer = ctypes.create_string_buffer(256)
    if _lib is not None and _lib.libbpf_strerror(err, buffer, len(buffer)) == 0:
        return buffer.value.decode(errors="replace")
    return os.strerror(err)


def _oserror(err: int, what: str) -> OSError:
    return OSError(err, f"{what}: {_strerror(err)}")


def _close_object(lib, handle: int) -> None:
    lib.bpf_object__close(handle)


class PanelObject:
    """The loaded ``panel.bpf.o``: its programs and maps, alive until `close`."""

    def __init__(self, handle: int, path: Path):
        self._lib = libbpf()
        self._handle = handle
        self.path = path
        # close() and the garbage collector share one call: it runs at most once.
        self._closer = weakref.finalize(self, _close_object, self._lib, handle)

    @classmethod
    def load(cls, path: Optional[os.PathLike] = None,
             reuse: Optional[Dict[str, int]] = None) -> "PanelObject":
        """Open and load the object (default: the one bootstrap.sh built).
        ``reuse`` maps map names to descriptors of maps that exist already (a
        dead controller's, `maps_of_program`): the programs use those."""
        from controllers.bpf.build import object_path

        path = Path(path) if path is not None else object_path()
        if not path.is_file():
            raise PanelError(f"no BPF object at {path}: run bootstrap.sh, or "
                             "`.venv/bin/python -m controllers.bpf.build` (needs clang)")
        lib = libbpf()
        handle = lib.bpf_object__open_file(os.fsencode(path), None)
        err = -lib.libbpf_get_error(handle)
        if not handle or err:
            err = err or ctypes.get_errno() or errnos.EINVAL
            raise PanelError(f"libbpf could not open {path}: {_strerror(err)}", err)
        for name, fd in sorted((reuse or {}).items()):
            found = lib.bpf_object__find_map_by_name(handle, name.encode())
            result = lib.bpf_map__reuse_fd(found, fd) if found else -errnos.ENOENT
            if result != 0:
                lib.bpf_object__close(handle)
                raise PanelError(f"{path}: cannot take over map {name!r}: "
                                 f"{_strerror(_errno(result))}", _errno(result))
        result = lib.bpf_object__load(handle)
        if result != 0:
            err = _errno(result)
            lib.bpf_object__close(handle)
            hint = " (needs root: CAP_BPF and CAP_NET_ADMIN)" if err == errnos.EPERM else \
                "; libbpf's log on stderr says why"
            raise PanelError(f"the kernel refused the BPF panel {path}: "
                             f"{_strerror(err)}{hint}", err)
        return cls(handle, path)

    @property
    def closed(self) -> bool:
        return not self._closer.alive

    def _open_handle(self) -> int:
        if self.closed:
            raise PanelError(f"{self.path}: the object is closed")
        return self._handle

    def program_fd(self, name: str) -> int:
        """The descriptor of program ``name`` (for TCA_BPF_FD or `test_run`)."""
        program = self._lib.bpf_object__find_program_by_name(self._open_handle(), name.encode())
        if not program:
            raise KeyError(f"no program {name!r} in {self.path}")
        fd = self._lib.bpf_program__fd(program)
        if fd < 0:
            raise _oserror(-fd, f"program {name!r} is not loaded")
        return fd

    def map(self, name: str) -> "BpfMap":
        fd = self._lib.bpf_object__find_map_fd_by_name(self._open_handle(), name.encode())
        if fd < 0:
            raise KeyError(f"no map {name!r} in {self.path}")
        return BpfMap(fd, owner=self)

    def close(self) -> None:
        """Close the programs and maps (gone once no tc filter uses them); idempotent."""
        self._closer()

    def __enter__(self) -> "PanelObject":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def maps_of_program(program_id: int) -> Dict[str, int]:
    """The maps a loaded program uses, by name: new descriptors the caller
    closes (`PanelObject.load` duplicates those it reuses)."""
    lib = libbpf()
    prog_fd = lib.bpf_prog_get_fd_by_id(program_id)
    if prog_fd < 0:
        raise _oserror(_errno(prog_fd), f"program id {program_id}")
    try:
        info, size = _ProgInfo(), ctypes.c_uint32(ctypes.sizeof(_ProgInfo))
        if lib.bpf_obj_get_info_by_fd(prog_fd, ctypes.byref(info), ctypes.byref(size)) != 0:
            raise _oserror(_errno(-1), f"program id {program_id}")
        ids = (ctypes.c_uint32 * info.nr_map_ids)()
        count = info.nr_map_ids
        info, size = _ProgInfo(), ctypes.c_uint32(ctypes.sizeof(_ProgInfo))
        info.nr_map_ids, info.map_ids = count, ctypes.addressof(ids)
        if lib.bpf_obj_get_info_by_fd(prog_fd, ctypes.byref(info), ctypes.byref(size)) != 0:
            raise _oserror(_errno(-1), f"program id {program_id}: its maps")
    finally:
        os.close(prog_fd)
    found: Dict[str, int] = {}
    try:
        for map_id in ids[:min(count, info.nr_map_ids)]:
            fd = lib.bpf_map_get_fd_by_id(map_id)
            if fd < 0:
                raise _oserror(_errno(fd), f"map id {map_id}")
            map_info, size = _MapInfo(), ctypes.c_uint32(ctypes.sizeof(_MapInfo))
            if lib.bpf_obj_get_info_by_fd(fd, ctypes.byref(map_info), ctypes.byref(size)) != 0:
                os.close(fd)
                raise _oserror(_errno(-1), f"map id {map_id}")
            found[map_info.name.decode()] = fd
    except BaseException:
        for fd in found.values():
            os.close(fd)
        raise
    return found


class BpfMap:
    """A map with __u32 keys, by descriptor; each call is one ``bpf(2)``.

    The descriptor belongs to its `PanelObject` (``owner``): once that is
    closed the number may name another file, so every call checks it first."""

    def __init__(self, fd: int, owner: Optional[PanelObject] = None):
        self.fd, self.owner = fd, owner
        self._lib = libbpf()
        info, size = _MapInfo(), ctypes.c_uint32(ctypes.sizeof(_MapInfo))
        if self._lib.bpf_obj_get_info_by_fd(fd, ctypes.byref(info), ctypes.byref(size)) != 0:
            raise _oserror(_errno(-1), f"map fd {fd}")
        if info.key_size != 4:
            raise ValueError(f"map fd {fd}: keys of {info.key_size} bytes, not a __u32")
        self.type, self.max_entries = info.type, info.max_entries
        self.value_size = info.value_size
        # A per-CPU map reads and writes one value per possible CPU, each
        # rounded up to 8 bytes.
        self.buffer_size = info.value_size
        if info.type in _PER_CPU:
            self.buffer_size = (info.value_size + 7) // 8 * 8 * possible_cpus()
        self._batch = True       # until the kernel says this map has no batch update

    def _fd(self) -> int:
        if self.owner is not None and self.owner.closed:
            raise OSError(errnos.EBADF, f"map fd {self.fd}: its object is closed")
        return self.fd

    def _key(self, key: int) -> ctypes.c_uint32:
        # c_uint32 would wrap -1 to 4294967295: a wrong port, silently.
        if not 0 <= key <= 0xFFFFFFFF:
            raise ValueError(f"map fd {self.fd}: key {key} is not a __u32")
        return ctypes.c_uint32(key)

    def _value(self, value: bytes) -> bytes:
        if len(value) != self.buffer_size:
            raise ValueError(f"map fd {self.fd}: a value is {self.buffer_size} bytes, "
                             f"not {len(value)}")
        return value

    def update(self, key: int, value: bytes) -> None:
        """Create or replace ``key``'s value."""
        key_buffer = self._key(key)
        result = self._lib.bpf_map_update_elem(self._fd(), ctypes.byref(key_buffer),
                                               self._value(value), BPF_ANY)
        if result != 0:
            raise _oserror(_errno(result), f"map fd {self.fd}: update of key {key}")

    def update_many(self, items: List[Tuple[int, bytes]]) -> None:
        """Write every (key, value), in order, with one ``BPF_MAP_UPDATE_BATCH``
        where the map has it (the kernel applies them one by one, not as a
        transaction), else one update each."""
        items = list(items)
        if not items:
            return
        done = 0
        if self._batch:
            keys = (ctypes.c_uint32 * len(items))(*(self._key(key).value for key, _ in items))
            values = b"".join(self._value(value) for _, value in items)
            count = ctypes.c_uint32(len(items))
            opts = _BatchOpts(ctypes.sizeof(_BatchOpts), BPF_ANY, 0)
            result = self._lib.bpf_map_update_batch(self._fd(), keys, values,
                                                    ctypes.byref(count), ctypes.byref(opts))
            if result == 0:
                return
            err = _errno(result)
            done = min(count.value, len(items))
            if err not in (errnos.EINVAL, errnos.EOPNOTSUPP, ENOTSUPP):
                where = f" at key {items[done][0]}" if done < len(items) else ""
                raise _oserror(err, f"map fd {self.fd}: batch update of {len(items)} keys "
                                    f"failed{where}, {done} written")
            # No batch update for this map (or this kernel): one call per key.
            self._batch = False
        for key, value in items[done:]:
            self.update(key, value)

    def lookup(self, key: int) -> Optional[bytes]:
        """``key``'s value, or None when it has none."""
        key_buffer = self._key(key)
        value = ctypes.create_string_buffer(self.buffer_size)
        result = self._lib.bpf_map_lookup_elem(self._fd(), ctypes.byref(key_buffer), value)
        if result != 0:
            err = _errno(result)
            if err == errnos.ENOENT:
                return None
            raise _oserror(err, f"map fd {self.fd}: lookup of key {key}")
        return value.raw

    def delete(self, key: int) -> None:
        """Remove ``key``; a key that is not there is no error."""
        key_buffer = self._key(key)
        result = self._lib.bpf_map_delete_elem(self._fd(), ctypes.byref(key_buffer))
        if result != 0:
            err = _errno(result)
            if err != errnos.ENOENT:
                raise _oserror(err, f"map fd {self.fd}: delete of key {key}")

    def _next_key(self, key: Optional[int]) -> Optional[int]:
        current, following = ctypes.c_uint32(key or 0), ctypes.c_uint32()
        result = self._lib.bpf_map_get_next_key(
            self._fd(), None if key is None else ctypes.byref(current), ctypes.byref(following))
        if result != 0:
            err = _errno(result)
            if err == errnos.ENOENT:
                return None
            raise _oserror(err, f"map fd {self.fd}: next key after {key}")
        return following.value

    def keys(self) -> List[int]:
        """Every key (an array map: every index), in the map's order."""
        keys: List[int] = []
        key = self._next_key(None)
        # A key deleted meanwhile sends a hash map back to its first key; the
        # bound stops a walk that a concurrent writer keeps restarting.
        while key is not None and len(keys) <= self.max_entries:
            keys.append(key)
            key = self._next_key(key)
        return keys

    def clear(self) -> None:
        """Every entry gone (an array map's values zeroed: its entries cannot go)."""
        if self.type in _ARRAYS:
            zero = bytes(self.buffer_size)
            for index in range(self.max_entries):
                self.update(index, zero)
            return
        # Always the first key, so a walk never resumes from a deleted one.
        for _ in range(self.max_entries + 1):
            key = self._next_key(None)
            if key is None:
                return
            self.delete(key)


def possible_cpus() -> int:
    count = libbpf().libbpf_num_possible_cpus()
    if count <= 0:
        raise _oserror(-count or errnos.EIO, "the number of possible CPUs")
    return count


def stats(stats_map: BpfMap) -> Dict[str, int]:
    """The panel's counters (`STATS`), summed over the CPUs."""
    counts = {}
    for index, name in enumerate(STATS):
        value = stats_map.lookup(index) or b""
        counts[name] = sum(int.from_bytes(value[i:i + 8], "little")
                           for i in range(0, len(value), 8))
    return counts


def test_run(prog_fd: int, packet: bytes, ifindex: int = 0) -> int:
    """Run a tc program once on ``packet`` (BPF_PROG_TEST_RUN) as if it came in
    on port ``ifindex`` (the skb's ``ingress_ifindex``); its return code
    (TC_ACT_OK 0, TC_ACT_SHOT 2, TC_ACT_REDIRECT 7).  Nothing is sent: a
    redirect is only returned.  The port need not exist (``ifindex`` of the
    skb, which would have to, stays the loopback)."""
    lib = libbpf()
    data = ctypes.create_string_buffer(bytes(packet), len(packet))
    opts = _TestRunOpts(sz=ctypes.sizeof(_TestRunOpts), data_in=ctypes.addressof(data),
                        data_size_in=len(packet), repeat=1)
    if ifindex:
        ctx = _SkBuff(ingress_ifindex=ifindex)
        opts.ctx_in, opts.ctx_size_in = ctypes.addressof(ctx), ctypes.sizeof(ctx)
    result = lib.bpf_prog_test_run_opts(prog_fd, ctypes.byref(opts))
    if result != 0:
        raise _oserror(_errno(result), f"test run of program fd {prog_fd}")
    return opts.retval


test_run.__test__ = False


def run_syscall(prog_fd: int) -> int:
    """Run a ``syscall`` program once (BPF_PROG_TEST_RUN, no packet, no
    context): the panel's ``arm``.  Its return code."""
    lib = libbpf()
    opts = _TestRunOpts(sz=ctypes.sizeof(_TestRunOpts))
    result = lib.bpf_prog_test_run_opts(prog_fd, ctypes.byref(opts))
    if result != 0:
        raise _oserror(_errno(result), f"run of program fd {prog_fd}")
    return opts.retval       # a helper for tests, not a test: pytest must not collect it
