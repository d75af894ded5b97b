"""nvcc for one `-c` compile, with its steps overlapped: what `PYTORCH_NVCC` names in a fast build.

nvcc runs its tools one after another: the device and host preprocessors, `cudafe++` (host front end),
`cicc` (device front end and optimiser), `ptxas`, `fatbinary`, then the host compiler on `cudafe++`'s
output, which includes cicc's stub and the fat binary. For a torch extension three of them parse all of
torch's headers. Only one thing orders `cudafe++` before `cicc`: the module id `cudafe++` writes when
it ends. `cicc` can make that id itself (`--gen_module_id_file`): it is the CRC of the source path and
the first external symbol, the same translation unit gives the same id. So this runs the two
preprocessors at once, then `cudafe++` next to `cicc` → `ptxas` → `fatbinary`, compares the ids, and
runs the host compile. Should the ids differ (code that is only on one side of `__CUDA_ARCH__` could
make the first external symbol differ), the device steps run again in nvcc's own order, with
`cudafe++`'s id, before the host compile: the objects are always the ones nvcc makes.

The commands are nvcc's own (`nvcc -dryrun` with the same arguments, temporary files in a private
folder); only cicc's module id file and the dependency file (gcc's `-MD` on the device preprocessing,
as nvcc derives it) differ. Anything this does not recognise (another nvcc mode, an unknown tool, an
unexpected shape) runs the real nvcc unchanged. A failing step ends the compile with the output of the
steps up to it, in nvcc's order, and its exit status; a fast build that fails is built again the plain
way by kb_build, with the real nvcc.

Usage (as torch's ninja file runs `$nvcc ARGS`): python kb_nvcc.py REAL_NVCC ARGS...
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

# nvcc modes and options whose steps this does not rearrange: the real nvcc runs them.
_UNHANDLED = {
    "-dryrun", "--dryrun", "-keep", "--keep", "-E", "--preprocess", "-M", "-MM", "-MMD",
    "--generate-dependencies", "--generate-nonsystem-dependencies", "-cuda", "--cuda", "-ptx", "--ptx",
    "-cubin", "--cubin", "-fatbin", "--fatbin", "-dc", "--device-c", "-dw", "--device-w", "-dlink",
    "--device-link", "-lib", "--lib", "-run", "--run", "-rdc=true", "--relocatable-device-code=true",
    "-v", "--verbose", "-save-temps", "--save-temps", "-time", "--time",
}
_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
_DEPS = re.compile(r"^-- Filter Dependencies -- > (.+)$")
_VAR = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?")
T0 = time.monotonic()
# The files each step writes, by the options naming them: (required, optional).
_WRITES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "host-preprocess": (("-o",), ()),
    "cudafe++": (("--gen_c_file_name", "--module_id_file_name"), ()),
    "cicc": ((), ("-o", "--gen_c_file_name", "--stub_file_name", "--gen_device_file_name")),
    "ptxas": (("-o",), ()),
    "fatbinary": ((), ("--embedded-fatbin", "--create")),
}
NVIDIA_TOOLS = {"cudafe++", "cicc", "ptxas", "fatbinary"}


def _trace(message: str) -> None:
    # KREFINE_NVCC_TRACE=1: when each step ended (for benchmarks and tests), on stderr.
    if os.environ.get("KREFINE_NVCC_TRACE"):
        print(f"krefine-nvcc: {message}", file=sys.stderr, flush=True)


@dataclass
class Step:
    index: int
    tool: str
    argv: list[str]
    after: set[int] = field(default_factory=set)
    # Files it writes (absolute where nvcc gave them so).
    writes: set[str] = field(default_factory=set)


@dataclass
class Plan:
    steps: list[Step]
    env: dict[str, str]
    module_id: str  # the one cudafe++ writes
    own_ids: list[str]  # the ones each cicc wrote
    device_steps: list[int]  # cicc, ptxas and fatbinary, to run again if the ids differ
    host_compile: int
    nvcc_argv: dict[int, list[str]]  # cicc's arguments as nvcc gave them


def _option(argv: list[str], name: str) -> str | None:
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(name + "="):
            return a[len(name) + 1 :]
    return None


def _expand(token: str, env: dict[str, str]) -> str | None:
    missing = False

    def sub(m: re.Match[str]) -> str:
        nonlocal missing
        if m.group(1) not in env:
            missing = True
            return ""
        return env[m.group(1)]

    out = _VAR.sub(sub, token)
    return None if missing else out


def parse_dryrun(text: str, base_env: dict[str, str]) -> tuple[list[list[str]], dict[str, str], str | None] | None:
    """nvcc's steps (argv lists, variables expanded), its variables and the dependency file it would
    write; None for anything unexpected."""
    env: dict[str, str] = {}
    commands: list[list[str]] = []
    deps: str | None = None
    for line in text.splitlines():
        if not line.startswith("#$ "):
            if line.strip():
                return None  # nvcc said something: let the real one say it
            continue
        body = line[3:].strip()
        if m := _DEPS.match(body):
            deps = m.group(1).strip()
            continue
        if (m := _ASSIGNMENT.match(body)) and not body.startswith(("-", '"')):
            try:
                words = shlex.split(m.group(2))
            except ValueError:
                return None
            value = " ".join(words)
            expanded = _expand(value, {**base_env, **env})
            env[m.group(1)] = expanded if expanded is not None else value
            continue
        try:
            words = shlex.split(body)
        except ValueError:
            return None
        if not words:
            continue
        if words[0] == "rm":
            continue  # temporary files go with the private folder
        argv: list[str] = []
        for w in words:
            x = _expand(w, {**base_env, **env})
            if x is None:
                return None
            argv.append(x)
        commands.append(argv)
    return commands, env, deps


def plan_steps(commands: list[list[str]], env: dict[str, str], output: str, dep_file: str | None) -> Plan | None:
    """The dependency graph of nvcc's steps; None unless it is the known shape of a `-c` compile:
    host preprocessors, one cudafe++, cicc/ptxas per architecture, one fatbinary, one host compile."""
    steps: list[Step] = []
    for i, argv in enumerate(commands):
        tool = os.path.basename(argv[0])
        if tool not in NVIDIA_TOOLS:
            if "-E" in argv:
                tool = "host-preprocess"
            elif "-c" in argv:
                tool = "host-compile"
            else:
                return None
        steps.append(Step(i, tool, list(argv)))
    kinds = [s.tool for s in steps]
    if kinds.count("cudafe++") != 1 or kinds.count("fatbinary") != 1 or kinds.count("host-compile") != 1:
        return None
    if kinds[-1] != "host-compile" or kinds.count("cicc") < 1 or kinds.count("cicc") != kinds.count("ptxas"):
        return None
    for s in steps:
        if s.tool in _WRITES:
            required, optional = _WRITES[s.tool]
            for opt in required:
                v = _option(s.argv, opt)
                if v is None:
                    return None
                s.writes.add(v)
            s.writes |= {v for opt in optional if (v := _option(s.argv, opt)) is not None}
            if s.tool == "cudafe++" and "--gen_module_id_file" not in s.argv:
                return None
        else:
            out = _option(s.argv, "-o")
            if out != output:
                return None
    # A step waits for every earlier step that wrote a file it names (a path or a path inside an option).
    for s in steps:
        text = "\0".join(s.argv)
        for t in steps[: s.index]:
            if any(w in text for w in t.writes):
                s.after.add(t.index)
    cudafe = next(s for s in steps if s.tool == "cudafe++")
    fatbinary = next(s for s in steps if s.tool == "fatbinary")
    host = steps[-1]
    module_id = _option(cudafe.argv, "--module_id_file_name")
    assert module_id is not None
    ciccs = [s for s in steps if s.tool == "cicc"]
    if cudafe.index not in host.after or any(s.after & {cudafe.index} != {cudafe.index} for s in ciccs):
        return None
    # cicc makes the module id itself (it computes the same one from the same translation unit: the
    # source path's CRC and its first external symbol) instead of waiting for cudafe++'s; the two are
    # compared before the host compile, which needs cicc's stub and the fat binary.
    own_ids: list[str] = []
    slow: list[list[str]] = []
    for n, s in enumerate(ciccs):
        slow.append(list(s.argv))
        own = f"{module_id}.cicc{n}"
        at = s.argv.index(module_id) if module_id in s.argv else -1
        if at < 1 or s.argv[at - 1] != "--module_id_file_name":
            return None
        s.argv[at] = own
        s.argv.insert(at - 1, "--gen_module_id_file")
        s.after.discard(cudafe.index)
        own_ids.append(own)
    host.after |= {fatbinary.index, *(s.index for s in ciccs)}
    if dep_file is not None:
        # nvcc derives the dependencies from the device-side preprocessing; so does this, through -MD.
        first = ciccs[0]
        pre = next((s for s in steps if s.tool == "host-preprocess" and s.index in first.after), None)
        if pre is None:
            return None
        pre.argv += ["-MD", "-MF", dep_file, "-MT", output]
    device = [s.index for s in steps if s.tool in ("cicc", "ptxas", "fatbinary")]
    nvcc_argv = {s.index: argv for s, argv in zip(ciccs, slow, strict=True)}
    return Plan(steps, env, module_id, own_ids, device, host.index, nvcc_argv)


class _Runner:
    """Runs the plan's steps as their inputs become ready, each with its output captured."""

    def __init__(self, plan: Plan, env: dict[str, str]) -> None:
        self.plan = plan
        self.env = env
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.outputs: dict[int, tuple[bytes, bytes]] = {}
        self.codes: dict[int, int] = {}
        self.lock = threading.Condition()
        self.started: set[int] = set()

    def _run(self, step: Step, argv: list[str]) -> None:
        try:
            proc = subprocess.Popen(
                argv, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
            )
        except OSError as exc:
            with self.lock:
                self.outputs[step.index] = (b"", f"nvcc error   : '{argv[0]}': {exc}\n".encode())
                self.codes[step.index] = 1
                self.lock.notify_all()
            return
        with self.lock:
            self.procs[step.index] = proc
        out, err = proc.communicate()
        _trace(f"{step.tool} ended at {time.monotonic() - T0:.2f} s")
        with self.lock:
            self.outputs[step.index] = (out, err)
            self.codes[step.index] = proc.returncode
            self.lock.notify_all()

    def _kill_running(self, after: int) -> None:
        with self.lock:
            running = [p for i, p in self.procs.items() if i not in self.codes and i > after]
        for p in running:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)

    def _ids_agree(self) -> bool:
        try:
            ours = Path(self.plan.module_id).read_bytes()
            return all(Path(own).read_bytes() == ours for own in self.plan.own_ids)
        except OSError:
            return False

    def _schedule(self) -> int | None:
        """Run everything; the index of the first failing step, or None."""
        plan = self.plan
        started = self.started
        checked = False
        while True:
            with self.lock:
                done = set(self.codes)
                failed = next((i for i in sorted(done) if self.codes[i] != 0), None)
                if failed is not None or len(done) == len(plan.steps):
                    return failed
                gate = {plan.host_compile} if not checked else set()
                ready = [s for s in plan.steps if s.index not in started | gate and s.after <= done]
            if not checked and set(plan.steps[plan.host_compile].after) <= done:
                checked = True
                if not self._ids_agree():
                    _trace("module ids differ: the device steps again, with cudafe++'s")
                    # nvcc's own order: cicc with cudafe++'s module id, and what follows from it.
                    for i in plan.device_steps:
                        with self.lock:
                            del self.codes[i]
                            self.outputs.pop(i, None)
                    for i in plan.device_steps:
                        self._run(plan.steps[i], plan.nvcc_argv.get(i, plan.steps[i].argv))
                        with self.lock:
                            if self.codes[i] != 0:
                                return i
                continue
            for s in ready:
                started.add(s.index)
                threading.Thread(target=self._run, args=(s, s.argv), daemon=True).start()
            with self.lock:
                if set(self.codes) == done:
                    self.lock.wait(1.0)

    def run(self) -> int:
        failed = self._schedule()
        if failed is not None:
            # nvcc would have run the steps before it to their end and reported the first that failed
            # (cudafe++ and cicc both report a syntax error; nvcc shows cudafe++'s).
            self._kill_running(after=failed)
            with self.lock:
                while any(i < failed and i not in self.codes for i in self.started):
                    self.lock.wait(1.0)
                failed = min(i for i, code in self.codes.items() if code != 0)
        # Output in nvcc's order, up to the step that failed.
        for s in self.plan.steps:
            if failed is not None and s.index > failed:
                break
            with self.lock:
                out, err = self.outputs.get(s.index, (b"", b""))
            sys.stdout.buffer.write(out)
            sys.stdout.flush()
            sys.stderr.buffer.write(err)
            sys.stderr.flush()
        if failed is None:
            return 0
        code = self.codes[failed]
        if code < 0:
            tool = os.path.basename(self.plan.steps[failed].argv[0])
            sys.stderr.write(f"nvcc error   : '{tool}' died due to signal {-code}\n")
            return 255
        return 2  # what nvcc exits with when one of its tools fails


MARKER_SUFFIX = ".nvcc-steps"


def _mark(output: str | None, how: str) -> None:
    """Leave `<object>.nvcc-steps` saying how the object was built (benchmarks read it; ninja does not)."""
    if output is not None:
        with contextlib.suppress(OSError):
            Path(output + MARKER_SUFFIX).write_text(how + "\n")


def _exec_real(real: str, args: list[str], output: str | None, why: str) -> int:
    _mark(output, f"nvcc ({why})")
    os.execv(real, [real, *args])
    return 127  # not reached


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: kb_nvcc.py REAL_NVCC ARGS...", file=sys.stderr)
        return 2
    real, args = argv[1], argv[2:]
    output = _option(args, "-o")
    if "-c" not in args or output is None:
        return _exec_real(real, args, None, "not a compile")
    if any(a in _UNHANDLED or a.split("=")[0] in _UNHANDLED for a in args):
        return _exec_real(real, args, output, "options")
    # torch's ninja file asks for `-MD -MF <out>.d`; older ones for --generate-dependencies-with-compile.
    dep_file = None
    if "--generate-dependencies-with-compile" in args:
        dep_file = _option(args, "--dependency-output")
    elif "-MD" in args:
        dep_file = _option(args, "-MF")
        if dep_file is None:
            return _exec_real(real, args, output, "options")
    tmp = tempfile.mkdtemp(prefix="krefine-nvcc-")
    plan: Plan | None = None
    why = "dry run failed"
    try:
        env = {**os.environ, "TMPDIR": tmp}
        try:
            dry = subprocess.run([real, "-dryrun", *args], env=env, capture_output=True, text=True, timeout=60, check=False)
            parsed = parse_dryrun(dry.stderr + dry.stdout, env) if dry.returncode == 0 else None
        except (OSError, subprocess.TimeoutExpired):
            parsed = None
        if parsed is not None:
            commands, variables, deps = parsed
            why = "unknown steps"
            if (deps is None) == (dep_file is None):
                plan = plan_steps(commands, variables, output, dep_file)
        if plan is not None:
            code = _Runner(plan, {**env, **plan.env, "TMPDIR": tmp}).run()
            if code == 0:
                _mark(output, "overlapped")
            return code
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return _exec_real(real, args, output, why)  # after the finally: exec does not come back


if __name__ == "__main__":
    sys.exit(main(sys.argv))
