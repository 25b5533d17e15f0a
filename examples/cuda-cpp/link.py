#!/usr/bin/env python3
"""Builds the CUDA C++ example against gpuheap's device library, without a GPU.

    link.py --device-library gpuheap_device.ptx [--include DIR] [--out DIR] [--update-header]

For sm_80 and sm_90:

1. compiles grow.cu (beside this script) with NVRTC to PTX as relocatable device code
   (`-rdc=true -arch=compute_NN -I<include>`);
2. links it with the device library (both as PTX inputs) by nvJitLink (`-arch=sm_NN`) into
   OUT/grow_smNN.cubin;
3. disassembles the cubin with nvdisasm and checks that it is a linked executable (ET_EXEC) and
   that the kernel's calls to gpuheap_malloc and gpuheap_free, and every named call in the cubin,
   go to a function the cubin defines;
4. reports the kernel's registers and stack (nvJitLink's info log) and the largest block it can
   be launched with (65536 registers per block, allocated per warp in units of 256);
5. links a probe kernel that calls all five functions of gpuheap.cuh the same way: its registers
   are the allocator's count as a calling kernel sees it. The header's GPUHEAP_REGISTERS_SMNN and
   GPUHEAP_MAX_BLOCK_THREADS_SMNN must equal what was measured; --update-header rewrites them.

Exit status: 0 when every check passed, 1 when one failed, 2 for bad arguments or a missing tool.

Route (chosen for robustness): the C APIs of NVRTC and nvJitLink through ctypes, from the PyPI
wheels `nvidia-cuda-nvrtc-cu12` and `nvidia-nvjitlink-cu12` (no CUDA toolkit, no compiler, no
Rust crate for nvJitLink needed); nvdisasm from `nvidia-cuda-nvdisasm`. The libraries are found in
the `nvidia` package of this Python, or through GPUHEAP_NVRTC, GPUHEAP_NVJITLINK and
GPUHEAP_NVDISASM (a path to the library or the executable).
"""

import argparse
import ctypes
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ARCHS = ("sm_80", "sm_90")
KERNEL = "gpuheap_example_grow"
# The kernel must call these (and each call must resolve to a function of the cubin).
CALLED = ("gpuheap_malloc", "gpuheap_free")
REGISTERS_PER_BLOCK = 65536  # sm_80 and sm_90
SUB_PARTITIONS = 4  # register sub-partitions per SM (sm_80, sm_90)
REGISTER_UNIT = 256  # registers are allocated per warp in units of 256

PROBE = r"""
#include "gpuheap.cuh"
// Calls every function of gpuheap.cuh: the registers of this kernel are the allocator's.
extern "C" __global__ void gpuheap_probe(const gpuheap_heap heap, unsigned long long *io) {
    void *p = gpuheap_malloc(&heap, io[0]);
    gpuheap_handle h = gpuheap_handle_alloc(&heap, io[1]);
    io[2] = (unsigned long long)gpuheap_handle_resolve(&heap, h);
    io[3] = (unsigned long long)gpuheap_handle_free(&heap, h);
    gpuheap_free(&heap, p);
}
"""


class Failed(Exception):
    """A check failed (exit 1)."""


class Setup(Exception):
    """A tool or an input is missing (exit 2)."""


def nvidia_file(env, *candidates):
    """The path in $env, else the first candidate under the `nvidia` package that exists."""
    if os.environ.get(env):
        return os.environ[env]
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        for c in candidates:
            if (Path(root) / c).exists():
                return str(Path(root) / c)
    return None


def load_libraries():
    nvrtc_path = nvidia_file("GPUHEAP_NVRTC", "cuda_nvrtc/lib/libnvrtc.so.12")
    jit_path = nvidia_file("GPUHEAP_NVJITLINK", "nvjitlink/lib/libnvJitLink.so.12")
    disasm = nvidia_file("GPUHEAP_NVDISASM", "cu13/bin/nvdisasm", "cuda_nvdisasm/bin/nvdisasm") or shutil.which("nvdisasm")
    missing = [n for n, p in (("nvidia-cuda-nvrtc-cu12", nvrtc_path), ("nvidia-nvjitlink-cu12", jit_path),
                              ("nvidia-cuda-nvdisasm", disasm)) if not p]
    if missing:
        raise Setup(f"not found: {', '.join(missing)} (pip install {' '.join(missing)})")
    try:
        return ctypes.CDLL(nvrtc_path), ctypes.CDLL(jit_path), disasm
    except OSError as e:
        raise Setup(f"cannot load NVRTC or nvJitLink: {e}") from e


def nvrtc_compile(nvrtc, source, name, options):
    """NVRTC: CUDA C++ source -> PTX (bytes). Raises Failed with the program log."""
    nvrtc.nvrtcGetErrorString.restype = ctypes.c_char_p

    def check(r, call):
        if r != 0:
            raise Failed(f"{call}: {nvrtc.nvrtcGetErrorString(r).decode()}")

    prog = ctypes.c_void_p()
    check(nvrtc.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None, None),
          "nvrtcCreateProgram")
    try:
        opts = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
        r = nvrtc.nvrtcCompileProgram(prog, len(options), opts)
        size = ctypes.c_size_t()
        check(nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size)), "nvrtcGetProgramLogSize")
        log = ctypes.create_string_buffer(size.value)
        check(nvrtc.nvrtcGetProgramLog(prog, log), "nvrtcGetProgramLog")
        if r != 0:
            raise Failed(f"NVRTC could not compile {name} ({' '.join(options)}):\n{log.value.decode()}")
        check(nvrtc.nvrtcGetPTXSize(prog, ctypes.byref(size)), "nvrtcGetPTXSize")
        ptx = ctypes.create_string_buffer(size.value)
        check(nvrtc.nvrtcGetPTX(prog, ptx), "nvrtcGetPTX")
        return ptx.value
    finally:
        nvrtc.nvrtcDestroyProgram(ctypes.byref(prog))


def nvjitlink(jit, arch, inputs):
    """nvJitLink: PTX inputs [(name, bytes)] -> (cubin bytes, info log). Raises Failed."""
    # The header's nvJitLinkCreate & co. are inline wrappers of versioned symbols; _12_0 is the
    # first 12.x ABI, which every 12.x library exports.
    def fn(name):
        return getattr(jit, f"__nvJitLink{name}_12_0")

    handle = ctypes.c_void_p()
    opts = [f"-arch={arch}", "-verbose"]
    r = fn("Create")(ctypes.byref(handle), len(opts), (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts]))
    if r != 0:
        raise Failed(f"nvJitLinkCreate({' '.join(opts)}) returned {r}")

    def log(kind):
        size = ctypes.c_size_t()
        fn(f"Get{kind}LogSize")(handle, ctypes.byref(size))
        buf = ctypes.create_string_buffer(size.value + 1)
        fn(f"Get{kind}Log")(handle, buf)
        return buf.value.decode(errors="replace")

    try:
        for name, data in inputs:
            r = fn("AddData")(handle, 2, data, ctypes.c_size_t(len(data)), name.encode())  # NVJITLINK_INPUT_PTX
            if r != 0:
                raise Failed(f"nvJitLinkAddData({name}) returned {r}:\n{log('Error')}")
        r = fn("Complete")(handle)
        if r != 0:
            raise Failed(f"nvJitLink for {arch} failed ({r}):\n{log('Error')}{log('Info')}")
        size = ctypes.c_size_t()
        fn("GetLinkedCubinSize")(handle, ctypes.byref(size))
        cubin = ctypes.create_string_buffer(size.value)
        fn("GetLinkedCubin")(handle, cubin)
        return cubin.raw, log("Info")
    finally:
        fn("Destroy")(ctypes.byref(handle))


def resources(info_log, kernel):
    """(registers, stack bytes) of `kernel` from nvJitLink's -verbose info log."""
    m = re.search(rf"Function properties for '{kernel}':\s*\n.*?used (\d+) registers.*?(\d+) stack", info_log)
    if not m:
        raise Failed(f"nvJitLink's info log has no resource line for {kernel}:\n{info_log}")
    return int(m.group(1)), int(m.group(2))


def max_block_threads(registers):
    """The most threads per block at `registers` per thread (whole warps, at most 1024), by the rule
    of `host/src/backend/limits.rs` (`Arch::max_block_threads`), which the GPU backend's launch check
    applies: a warp's registers are allocated in units of 256, and a block's warps are rounded up to
    the SM's 4 register sub-partitions (so 118 registers give 16 warps, 512 threads, not 17)."""
    per_warp = -(-registers * 32 // REGISTER_UNIT) * REGISTER_UNIT
    warps = 32
    while warps > 0 and (-(-warps // SUB_PARTITIONS) * SUB_PARTITIONS * per_warp > REGISTERS_PER_BLOCK):
        warps -= 1
    return warps * 32


def check_calls(disasm, cubin_path, kernel, called):
    """Checks the SASS of a linked cubin: returns the gpuheap functions the kernel calls."""
    out = subprocess.run([disasm, str(cubin_path)], capture_output=True, text=True)
    if out.returncode != 0:
        raise Failed(f"nvdisasm {cubin_path} failed:\n{out.stderr}")
    sass = out.stdout
    if '.elftype\t@"ET_EXEC"' not in sass and '.elftype @"ET_EXEC"' not in sass:
        raise Failed(f"{cubin_path} is not a linked executable cubin (no ET_EXEC)")
    defined, calls, section = set(), {}, None
    for line in sass.splitlines():
        m = re.match(r"\s*\.section\s+\.text\.([\w$.]+),", line)
        if m:
            section = m.group(1)
            defined.add(section)
            continue
        m = re.search(r"\bCALL\.\w+(?:\.\w+)*\s+`\(([\w$.]+)\)", line)
        if m and not m.group(1).startswith(".L"):
            calls.setdefault(section, set()).add(m.group(1))
    unresolved = sorted({t for ts in calls.values() for t in ts} - defined)
    if unresolved:
        raise Failed(f"{cubin_path}: calls to functions the cubin does not define: {', '.join(unresolved)}")
    mine = calls.get(kernel, set())
    missing = [f for f in called if f not in mine]
    if kernel not in defined or missing:
        raise Failed(f"{cubin_path}: {kernel} does not call {', '.join(missing) or '(kernel missing)'}")
    return sorted(f for f in mine if f.startswith("gpuheap_"))


def header_figures(header):
    text = header.read_text()
    return {(k, a): int(v) for k, a, v in
            re.findall(r"#define GPUHEAP_(REGISTERS|MAX_BLOCK_THREADS)_SM(\d+) (\d+)", text)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device-library", required=True, type=Path, help="gpuheap_device.ptx")
    ap.add_argument("--include", type=Path, default=HERE.parent.parent / "kernels/include",
                    help="folder of gpuheap.cuh (default: the kernels crate's include/)")
    ap.add_argument("--out", type=Path, default=HERE / "out", help="where the cubins go (default: out/ here)")
    ap.add_argument("--update-header", action="store_true",
                    help="write the measured register figures into gpuheap.cuh instead of checking them")
    args = ap.parse_args()
    started = time.monotonic()
    try:
        header = args.include / "gpuheap.cuh"
        if not header.is_file():
            raise Setup(f"{header}: no such file")
        if not args.device_library.is_file() or args.device_library.stat().st_size == 0:
            raise Setup(f"{args.device_library}: missing or empty (was the PTX built? scripts/device-library)")
        library = args.device_library.read_bytes()
        if b".visible .func" not in library or b".entry" in library:
            raise Failed(f"{args.device_library} is not the device library (`.visible .func` exports, no `.entry`)")
        nvrtc, jit, disasm = load_libraries()
        args.out.mkdir(parents=True, exist_ok=True)
        grow = (HERE / "grow.cu").read_text()
        measured = {}
        for arch in ARCHS:
            nn = arch[3:]
            opts = ["-rdc=true", f"-arch=compute_{nn}", f"-I{args.include}", "-std=c++17"]
            lib_input = ("gpuheap_device.ptx", library)
            ptx = nvrtc_compile(nvrtc, grow, "grow.cu", opts)
            cubin, info = nvjitlink(jit, arch, [("grow.ptx", ptx), lib_input])
            path = args.out / f"grow_sm{nn}.cubin"
            path.write_bytes(cubin)
            called = check_calls(disasm, path, KERNEL, CALLED)
            regs, stack = resources(info, KERNEL)
            print(f"{arch}: {KERNEL}: {regs} registers, {stack} B stack; calls {', '.join(called)}, "
                  f"resolved in {path.name}; at most {max_block_threads(regs)} threads per block")
            probe_cubin, probe_info = nvjitlink(jit, arch, [("probe.ptx", nvrtc_compile(nvrtc, PROBE, "probe.cu", opts)),
                                                            lib_input])
            (args.out / f"probe_sm{nn}.cubin").write_bytes(probe_cubin)
            check_calls(disasm, args.out / f"probe_sm{nn}.cubin", "gpuheap_probe",
                        ("gpuheap_malloc", "gpuheap_free", "gpuheap_handle_alloc", "gpuheap_handle_resolve",
                         "gpuheap_handle_free"))
            pregs, pstack = resources(probe_info, "gpuheap_probe")
            measured[("REGISTERS", nn)] = pregs
            measured[("MAX_BLOCK_THREADS", nn)] = max_block_threads(pregs)
            print(f"{arch}: a kernel calling the allocator: {pregs} registers, {pstack} B stack; "
                  f"at most {max_block_threads(pregs)} threads per block")
        lines = "\n".join(f"#define GPUHEAP_{k}_SM{a} {v}" for (k, a), v in sorted(measured.items()))
        if args.update_header:
            text = header.read_text()
            for (k, a), v in measured.items():
                text = re.sub(rf"#define GPUHEAP_{k}_SM{a} \d+", f"#define GPUHEAP_{k}_SM{a} {v}", text)
            header.write_text(text)
            print(f"{header}: register figures updated")
        elif header_figures(header) != measured:
            raise Failed(f"{header}: the register figures differ from the measured ones; they should read\n{lines}\n"
                         f"(run {Path(__file__).name} --update-header, or edit them)")
        else:
            print(f"{header.name}: register figures match the measurement")
    except Setup as e:
        print(f"link.py: {e}", file=sys.stderr)
        return 2
    except Failed as e:
        print(f"link.py: FAILED: {e}", file=sys.stderr)
        return 1
    print(f"link.py: sm_80 and sm_90 cubins in {args.out} ({time.monotonic() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
