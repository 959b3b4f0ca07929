#!/usr/bin/env python3
"""The layers of docs/architecture.md ("Who may use whom"), checked on what
the build made.  The include directories already make a wrong #include
fail to compile; this checks what was linked:

 1. libneoflow-client.so holds no object of a daemon library (no global
    function of daemon/codegen, daemon/search, daemon/cache, daemon/ among
    its symbols) and needs no LLVM, SQLite, XGBoost, libuv or NVRTC;
 2. neoflowd and neoflow-worker hold no object of a client library
    (client/, client/autodiff, client/executor);
 3. the library's contract: libneoflow-client.so uses neither stdout nor
    stderr (it reports through the session's log callback), and at most
    two of its source files read the environment (common/env.c does);
 4. the producers of kernels (client/dlink.c, client/gpu_local.c), the
    mailbox (client/ktable.c) and the CPU's device entry never see the
    session: none of them includes session_int.h (they see nf_ktable.h);
 5. no circle among the files of the client's libraries: a file that uses
    a function another defines while that one (directly or through
    others) uses one of its own.  CIRCLES_LEFT lists the circles known
    and accepted (none today); a new circle, or a listed one gone, fails,
    so the list stays true.

Usage: layering.py BUILD_DIR [SOURCE_DIR] (SOURCE_DIR: BUILD_DIR/.. unless
given; the source check 4 is skipped where it is not a NeoFlow tree).  Exit 0 when all hold, 1 with each breach
named, 77 (skipped) without nm or readelf."""
import os
import shutil
import subprocess
import sys

CLIENT_LIBS = ['client/libnfclient.a', 'client/autodiff/libnfautodiff.a',
               'client/executor/libnfexec.a']
DAEMON_LIBS = ['daemon/codegen/libnfcodegen.a', 'daemon/codegen/libnfcuda.a',
               'daemon/search/libnfsearch.a', 'daemon/cache/libnfcache.a',
               'daemon/libnfdaemon.a']
FORBIDDEN_NEEDED = ['libLLVM', 'libsqlite3', 'libxgboost', 'libuv', 'libnvrtc']
# the files that see the kernel table, never the session
TABLE_ONLY = ['client/dlink.c', 'client/gpu_local.c', 'client/ktable.c']
# what libneoflow-client.so is made of (client/meson.build)
# (proto/libnfdconn.a, the blocking daemon connection, lies below both
# sides: the library, the tool and a node daemon's upstream lookups)
SO_LIBS = CLIENT_LIBS + ['proto/libnfdconn.a', 'common/libnfcommon.a', 'common/lower/libnflower.a',
                         'common/runtime/libnfruntime.a', 'proto/libnfproto.a']
PRINTS = {'stdout', 'stderr', 'printf', 'puts', 'perror', 'putchar', 'vprintf', 'psignal'}
ENV_READS = {'getenv', 'secure_getenv', 'environ', '__environ'}

# Circles among the client's files still to be cut (each a sorted tuple of
# object names).  Keep in step with the code: see the module's docstring.
CIRCLES_LEFT = set()


def nm(path, *flags):
    out = subprocess.run(['nm', '-A', *flags, path], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f'nm {path}: {out.stderr.strip()}')
    return out.stdout.splitlines()


def archive_symbols(path):
    """{object file name (e.g. 'session.c'): (defined globals, undefined)}
    of a static archive; nm -A prints 'ARCHIVE:OBJECT:[ADDRESS] TYPE NAME'."""
    objs = {}
    for line in nm(path):
        parts = line.split()
        if len(parts) != 3:
            continue
        fields = parts[0].split(':')
        if len(fields) < 2:
            continue
        obj = os.path.basename(fields[1])
        if obj.endswith('.o'):
            obj = obj[:-2]
        d, u = objs.setdefault(obj, (set(), set()))
        if parts[1] in 'TDBRCVW':
            d.add(parts[2])
        elif parts[1] == 'U':
            u.add(parts[2])
    return objs


def defined_in(path):
    names = set()
    for line in nm(path, '--defined-only'):
        parts = line.split()
        if len(parts) >= 3 and parts[-2] in 'TtDdBbRrCVW':
            names.add(parts[-1])
    return names


def globals_of(build, libs):
    """{symbol: 'lib:object'} of the global functions and data of libs."""
    out = {}
    for lib in libs:
        path = os.path.join(build, lib)
        if not os.path.exists(path):
            continue  # not built in this configuration (no LLVM, no search)
        for obj, (d, _) in archive_symbols(path).items():
            for s in d:
                out[s] = f'{lib}:{obj}'
    return out


def sccs(nodes, edges):
    """Strongly connected components of more than one node (Tarjan)."""
    index, low, on, stack, res, counter = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                res.append(tuple(sorted(comp)))

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return res


def main():
    if len(sys.argv) not in (2, 3):
        print(__doc__)
        return 2
    build = sys.argv[1]
    src = sys.argv[2] if len(sys.argv) == 3 else os.path.join(build, '..')
    if not shutil.which('nm') or not shutil.which('readelf'):
        print('layering: SKIP: nm or readelf missing (binutils)')
        return 77
    bad = []

    so = os.path.join(build, 'client', 'libneoflow-client.so')
    daemon_globals = globals_of(build, DAEMON_LIBS)
    hits = sorted(s for s in defined_in(so) if s in daemon_globals)
    for s in hits[:20]:
        bad.append(f'libneoflow-client.so holds {s} of {daemon_globals[s]}')
    dyn = subprocess.run(['readelf', '-d', so], capture_output=True, text=True).stdout
    for lib in FORBIDDEN_NEEDED:
        if f'[{lib}' in dyn:
            bad.append(f'libneoflow-client.so needs {lib}')

    dynu = set()
    for line in subprocess.run(['nm', '-D', '--undefined-only', so], capture_output=True,
                               text=True).stdout.splitlines():
        dynu.add(line.split()[-1].split('@')[0])
    for sym in sorted(dynu & PRINTS):
        bad.append(f'libneoflow-client.so uses {sym} (the library never prints: '
                   'nf__session_log)')
    readers = sorted(f'{lib}:{obj}' for lib in SO_LIBS
                     for obj, (_, u) in archive_symbols(os.path.join(build, lib)).items()
                     if u & ENV_READS)
    if len(readers) > 2:
        bad.append(f'{len(readers)} files of libneoflow-client read the environment '
                   f'(at most 2; use nf_env, common/nf_env.h): {", ".join(readers)}')

    client_globals = globals_of(build, CLIENT_LIBS)
    for exe in ['daemon/neoflowd', 'daemon/search/neoflow-worker']:
        path = os.path.join(build, exe)
        if not os.path.exists(path):
            continue  # no daemon in this configuration
        hits = sorted(s for s in defined_in(path) if s in client_globals)
        for s in hits[:20]:
            bad.append(f'{exe} holds {s} of {client_globals[s]}')

    for f in TABLE_ONLY:
        path = os.path.join(src, f)
        if os.path.exists(path) and '#include "session_int.h"' in open(path).read():
            bad.append(f'{f} includes session_int.h: a producer sees the kernel table '
                       '(nf_ktable.h), never the session')

    # circles among the client's files
    defs, uses = {}, {}
    for lib in CLIENT_LIBS:
        for obj, (d, u) in archive_symbols(os.path.join(build, lib)).items():
            name = obj
            uses[name] = u
            for s in d:
                defs[s] = name
    edges = {f: {defs[s] for s in u if s in defs and defs[s] != f} for f, u in uses.items()}
    found = set(sccs(uses.keys(), edges))
    for c in sorted(found - CIRCLES_LEFT):
        pairs = sorted(f'{a} -> {b}' for a in c for b in edges[a] if b in c)
        bad.append(f'a circle among the client\'s files: {", ".join(c)} ({"; ".join(pairs)})')
    for c in sorted(CIRCLES_LEFT - found):
        bad.append(f'the circle {", ".join(c)} is gone: take it out of CIRCLES_LEFT '
                   '(tests/layering.py)')

    for b in bad:
        print(f'layering: {b}')
    if bad:
        return 1
    print(f'layering: ok ({len(found)} circle(s) among the client\'s files)')
    return 0


if __name__ == '__main__':
    sys.exit(main())
