#!/usr/bin/env python3
"""SASS instruction counts of the attention core's key-tile loop, per core_kernel /
persist_kernel instantiation (bench/gpu/NOTES.md "v3-v6 of the mass bookkeeping" and
"MF_CORE_PVWAIT" cite its output).

Builds kernels/attn_core.cu to a cubin (nvcc -cubin, sm_90a), disassembles it and, for each
selected instantiation, takes the smallest loop (a backward branch) holding >= 12 HGMMA:
the per-key-tile loop. The diagonal-mask block (a forward-skipped region of > 100
instructions, run on diagonal tiles only) is left out. Prints the opcode counts, where the
P.V wait (WARPGROUP.DEPBAR.LE gsb0, 0x0) sits relative to the softmax's MUFU.EX2s, the
highest register index (no LDL / STL = no spills) and a per-opcode diff between the
instantiations.

No disassembler ships with this machine's CUDA 13: Debian's nvidia-cuda-toolkit (11.8,
non-free) has nvdisasm; `apt-get download nvidia-cuda-toolkit && dpkg-deb -x` it anywhere.
That nvdisasm reads only the old cubin header, so the cubin's ELF ABI version (8 -> 7) and
e_flags (-> sm_90's old encoding, 0x5a055a) are rewritten on a copy first; the SASS itself
is unchanged.

  python3 bench/gpu/sass_loop.py --nvdisasm /path/to/nvdisasm [--match REGEX]
  (--match 'core_kernelI13__nv_bfloat16Li128ELi128ELi[0-6]ELb0ELb0E': the mass variants;
   the default: bf16 d128 dense, gathered and persistent (232), PVW off and on)
"""
import argparse
import collections
import os
import re
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def sass(nvcc, nvdisasm, tmp):
    cubin = os.path.join(tmp, "attn_core.cubin")
    subprocess.run([nvcc, "-cubin", "-O3", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a",
                    "-Iproto", "-Ikernels", "-Ibuild/gen", "kernels/attn_core.cu", "-o", cubin],
                   cwd=ROOT, check=True)
    b = bytearray(open(cubin, "rb").read())
    b[7], b[8] = 0x33, 7  # OS/ABI, ABI version as the old toolkits wrote them
    struct.pack_into("<I", b, 0x30, 0x5A055A)  # e_flags: sm_90, old encoding
    old = os.path.join(tmp, "attn_core_old.cubin")
    open(old, "wb").write(b)
    return subprocess.run([nvdisasm, "-c", old], check=True, capture_output=True,
                          text=True).stdout


def functions(text):
    out, cur = {}, None
    for ln in text.split("\n"):
        m = re.match(r"^\.text\.(\S+):", ln)
        if m:
            cur = m.group(1)
            out[cur] = []
        elif cur is not None:
            out[cur].append(ln)
    return out


def parse(body):
    ins, labels = [], {}
    for ln in body:
        m = re.match(r"^\s*\.(L_x_\d+):", ln)
        if m:
            labels[m.group(1)] = len(ins)
            continue
        m = re.match(r"\s*/\*([0-9a-f]+)\*/\s+(.*?);", ln)
        if m:
            t = m.group(2).strip()
            ins.append((re.sub(r"^@!?U?P\w+\s+", "", t).split()[0], t))
    return ins, labels


def loop(ins, labels):
    """(the loop's instructions without the mask block, mask block size)"""
    best = None
    for k, (_, t) in enumerate(ins):
        m = re.search(r"BRA.*`\(\.(L_x_\d+)\)", t)
        if m and m.group(1) in labels and labels[m.group(1)] < k:
            a = labels[m.group(1)]
            if (sum(1 for o, _ in ins[a:k] if o.startswith("HGMMA")) >= 12 and
                    (best is None or k - a < best[1] - best[0])):
                best = (a, k)
    if best is None:
        return [], 0
    a, b = best
    skip = set()
    for k in range(a, b):
        m = re.search(r"BRA.*`\(\.(L_x_\d+)\)", ins[k][1])
        if m and m.group(1) in labels and k < labels[m.group(1)] <= b and \
                labels[m.group(1)] - k > 100:
            skip.update(range(k + 1, labels[m.group(1)]))
    return [ins[k] for k in range(a, b + 1) if k not in skip], len(skip)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nvcc", default="/usr/local/cuda/bin/nvcc")
    ap.add_argument("--nvdisasm", required=True)
    ap.add_argument("--match",
                    default=r"(core_kernelI13__nv_bfloat16Li128ELi128ELi0ELb[01]ELb[01]E|"
                            r"persist_kernelI13__nv_bfloat16Li128ELi232ELb[01]E)",
                    help="regex on the mangled name (default: bf16 d128 dense, gathered and "
                         "persistent, MF_CORE_PVWAIT off and on)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        funcs = functions(sass(args.nvcc, args.nvdisasm, tmp))
    counts = {}
    for name, body in sorted(funcs.items()):
        if not re.search(r"(core|persist)_kernel", name) or not re.search(args.match, name):
            continue
        ins, labels = parse(body)
        body_ins, masked = loop(ins, labels)
        m = re.search(r"core_kernelI(\w+?)Li(\d+)ELi(\d+)ELi(\d+)ELb(\d)ELb(\d)E", name)
        if m:
            tag = (f"{m.group(1).lstrip('0123456789').strip('_')} d{m.group(2)} BN{m.group(3)} "
                   f"{'v' + m.group(4) if m.group(4) != '0' else 'dense'}"
                   f"{'+gather' * (m.group(5) == '1')}{'+pvw' * (m.group(6) == '1')}")
        else:
            m = re.search(r"persist_kernelI(\w+?)Li(\d+)ELi(\d+)ELb(\d)E", name)
            tag = (f"{m.group(1).lstrip('0123456789').strip('_')} d{m.group(2)} r{m.group(3)} "
                   f"persist{'+pvw' * (m.group(4) == '1')}")
        h = collections.Counter(op for op, _ in body_ins)
        counts[tag] = h
        ex = [i for i, (op, _) in enumerate(body_ins) if op.startswith("MUFU.EX2")]
        dep0 = [i for i, (op, t) in enumerate(body_ins)
                if op.startswith("WARPGROUP.DEPBAR") and t.endswith("0x0")]
        regs = max((int(x) for ln in body for x in re.findall(r"\bR(\d+)\b", ln)), default=0)
        local = sum(1 for ln in body if re.search(r"\b(LDL|STL)\b", ln))
        after = sum(1 for i in ex if dep0 and i < dep0[0])
        pk = [i for i, (op, _) in enumerate(body_ins) if op.startswith("F2FP")]
        pk_after = sum(1 for i in pk if dep0 and i > dep0[0])
        print(f"{tag}: loop {len(body_ins)} instructions (mask block {masked} apart), "
              f"P.V wait after {after} of {len(ex)} EX2 and before {pk_after} of {len(pk)} "
              f"F2FP (P packs), max R{regs}, LDL/STL {local}")
    if len(counts) > 1:
        tags = list(counts)
        keys = sorted(set().union(*counts.values()), key=lambda k: -counts[tags[0]][k])
        print("\nopcode diff (rows that differ)")
        wd = max(10, max(len(t.split()[-1]) for t in tags) + 1)
        print(f"{'':32s}" + "".join(f"{t.split()[-1]:>{wd}s}" for t in tags))
        for k in keys:
            row = [counts[t][k] for t in tags]
            if len(set(row)) > 1:
                print(f"{k:32s}" + "".join(f"{x:{wd}d}" for x in row))
        print(f"{'total':32s}" + "".join(f"{sum(counts[t].values()):{wd}d}" for t in tags))
    return 0


if __name__ == "__main__":
    sys.exit(main())
