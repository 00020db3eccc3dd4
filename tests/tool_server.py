"""Run the package's command-line tools as the tests would with ``python TOOL ARGS``, without paying Python's
start-up for each run.

``run_tool(args, cwd, env)`` takes the argument list of ``subprocess.run([sys.executable, *args])`` (a script path
or ``-m module`` first) and returns the same ``subprocess.CompletedProcess`` (text stdout and stderr, the exit
status). Each test process keeps one server process that has imported torch, mmengine, mmcv, mmdet, mmseg and
mmpretrain once; every run is a fork of it, so a run starts from that state and nothing it does (registries,
global settings, open files) reaches the next one. In the fork the working directory, the environment,
``sys.argv``, ``sys.path[0]`` and the entries of ``$PYTHONPATH`` are those of a fresh ``python TOOL``; the script
runs as ``__main__``; an uncaught exception prints its traceback and exits 1, ``SystemExit`` exits with its code,
and the interpreter's exit handlers (logging's flush among them) run before the fork ends.

What a fork cannot give stays with ``subprocess``: runs that must import from nothing (the import-boundary
tests), that launch ranks (``torch.distributed.run``) or that the test signals while they run.

The server also computes two of mmengine's pure lookups once instead of in every run (``pure_lookups.install``):
yapf's formatting of a config text is kept on disk under the server's folder, shared by its runs.
"""
import atexit
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

PRELOAD = ('torch', 'mmengine.runner', 'mmcv.ops', 'mmdet.models', 'mmdet.datasets', 'mmdet.evaluation',
           'mmdet.visualization', 'mmseg.models', 'mmseg.datasets', 'mmseg.evaluation', 'mmseg.visualization',
           'mmpretrain.models', 'cpvt_backbones.adapters.runner', 'cpvt_backbones.adapters.engines')

_server = None


class _Server:
    def __init__(self):
        self.folder = Path(tempfile.mkdtemp(prefix='tool_server_'))
        env = dict(os.environ, PYTHONUNBUFFERED='1', OMP_NUM_THREADS='1')
        # Unbuffered: each reply line is read from the pipe itself, so select() sees what is still to come.
        self.proc = subprocess.Popen([sys.executable, __file__, str(self.folder)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, bufsize=0, env=env, cwd=self.folder)
        self.count = 0

    def alive(self):
        return self.proc.poll() is None

    def run(self, args, cwd, env, timeout):
        self.count += 1
        out, err = self.folder / f'{self.count}.out', self.folder / f'{self.count}.err'
        request = dict(args=[str(a) for a in args], cwd=str(Path(cwd or os.getcwd()).resolve()), env=env,
                       stdout=str(out), stderr=str(err))
        self.proc.stdin.write(json.dumps(request).encode() + b'\n')
        reply = self.proc.stdout.readline()
        if not reply:
            raise RuntimeError(f'the tool server exited (status {self.proc.wait()}); its traceback is in stderr')
        pid = json.loads(reply)['pid']
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            os.kill(pid, signal.SIGKILL)
        returncode = json.loads(self.proc.stdout.readline())['returncode']
        stdout, stderr = out.read_text(errors='replace'), err.read_text(errors='replace')
        out.unlink(), err.unlink()
        if not ready:
            raise subprocess.TimeoutExpired([sys.executable, *args], timeout, stdout, stderr)
        return subprocess.CompletedProcess([sys.executable, *args], returncode, stdout, stderr)

    def close(self):
        if self.alive():
            self.proc.stdin.close()
            self.proc.wait(timeout=60)


def run_tool(args, cwd=None, env=None, timeout=None):
    """``subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True,
    timeout=timeout)``, run as a fork of this process's tool server (started on the first call)."""
    global _server
    if str(args[0]) == '-c':
        raise ValueError("run_tool runs a script or '-m module'; run code given with -c through subprocess")
    if _server is None or not _server.alive():
        _server = _Server()
        atexit.register(_server.close)
    return _server.run(args, cwd, dict(os.environ) if env is None else dict(env), timeout)


def _python_path(env) -> list[str]:
    return [os.path.abspath(p) for p in env.get('PYTHONPATH', '').split(os.pathsep) if p]


def _run_child(request):
    """In the fork: become ``python ARGS`` in the request's folder and environment, and never return."""
    import atexit as exits
    import runpy
    import traceback
    stdin = os.open(os.devnull, os.O_RDONLY)
    out = os.open(request['stdout'], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    err = os.open(request['stderr'], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    for fd, target in ((stdin, 0), (out, 1), (err, 2)):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request['cwd'])
    # the run's $PYTHONPATH in place of the server's, where a new interpreter puts it: after sys.path[0]
    for entry in _python_path(os.environ):
        if entry in sys.path[1:]:
            sys.path.remove(entry)
    sys.path[1:1] = _python_path(request['env'])
    os.environ.clear()
    os.environ.update(request['env'])
    args = request['args']
    try:
        if args[0] == '-m':
            sys.argv, sys.path[0] = [args[1], *args[2:]], os.getcwd()
            runpy.run_module(args[1], run_name='__main__', alter_sys=True)
        else:
            sys.argv, sys.path[0] = list(args), str(Path(args[0]).resolve().parent)
            runpy.run_path(args[0], run_name='__main__')
        code = 0
    except SystemExit as exit_:
        code = exit_.code
        if code is None:
            code = 0
        elif not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001  (what the interpreter does with an uncaught exception)
        traceback.print_exc()
        code = 1
    try:
        exits._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def _serve(folder):
    import importlib

    import pure_lookups  # beside this file: sys.path[0] here, the tool's own folder in each run
    for name in PRELOAD:
        # a module this stack lacks is left out: a run that needs it fails as it would in a new interpreter
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    pure_lookups.install(Path(folder) / 'formatted')
    protocol = sys.stdout
    for line in sys.stdin:
        request = json.loads(line)
        protocol.flush()
        pid = os.fork()
        if pid == 0:
            _run_child(request)
        protocol.write(json.dumps(dict(pid=pid)) + '\n')
        protocol.flush()
        _, status = os.waitpid(pid, 0)
        protocol.write(json.dumps(dict(returncode=os.waitstatus_to_exitcode(status))) + '\n')
        protocol.flush()


if __name__ == '__main__':
    _serve(sys.argv[1])
