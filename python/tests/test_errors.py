"""Bad arguments: every error names the function and the argument (numpy, CPU)."""

import ctypes
import subprocess
import sys

import numpy as np
import pytest

import smla
from smla import _lib
from refs import DC, aligned_zeros


def setup():
    cache = aligned_zeros((32, 1152), np.uint8)
    q = np.zeros((2, 4, DC + 64), np.uint16)
    slots = np.zeros((2, 8), np.int32)
    return cache, q, slots


def test_struct_sizes_match_the_header():
    for name, size in _lib.EXPECTED_SIZES.items():
        assert ctypes.sizeof(getattr(_lib, name)) == size, name
    assert _lib.packer(_lib.smla_forward_params).size == 208


def test_struct_offsets_match_the_c_compiler(tmp_path):
    """Compiles a probe against include/smla.h when a C compiler is there."""
    import os
    import shutil
    cc = shutil.which("cc") or shutil.which("gcc")
    inc = os.path.join(os.path.dirname(__file__), "..", "..", "include")
    if not cc or not os.path.exists(os.path.join(inc, "smla.h")):
        pytest.skip("no C compiler or no include/smla.h next to the package")
    lines = ['#include <stdio.h>', '#include <stddef.h>', '#include "smla.h"', 'int main(void){']
    for name in _lib.EXPECTED_SIZES:
        st = getattr(_lib, name)
        lines.append('printf("%s %%zu\\n", sizeof(%s));' % (name, name))
        for f, _ in st._fields_:
            lines.append('printf("%s.%s %%zu\\n", offsetof(%s, %s));' % (name, f, name, f))
    lines.append("return 0;}")
    src = tmp_path / "probe.c"
    src.write_text("\n".join(lines))
    exe = tmp_path / "probe"
    subprocess.check_call([cc, "-I", inc, str(src), "-o", str(exe)])
    got = dict(l.split() for l in subprocess.check_output([str(exe)]).decode().splitlines())
    for name in _lib.EXPECTED_SIZES:
        st = getattr(_lib, name)
        assert int(got[name]) == ctypes.sizeof(st), name
        for f, _ in st._fields_:
            assert int(got["%s.%s" % (name, f)]) == getattr(st, f).offset, (name, f)


@pytest.mark.parametrize("mutate,exc,pattern", [
    (lambda a: a.update(q=a["q"].astype(np.int32)), TypeError, r"forward: q_nope: expected dtype bfloat16"),
    (lambda a: a.update(q=a["q"][0]), ValueError, r"q_nope: expected 3 dimensions"),
    (lambda a: a.update(q=np.zeros((2, 4, 600), np.uint16)), ValueError, r"q_nope: with q_pe=None its last dimension must be 576"),
    (lambda a: a.update(slots=a["slots"].astype(np.int64)), TypeError, r"slots: expected dtype int32"),
    (lambda a: a.update(slots=np.zeros((3, 8), np.int32)), ValueError, r"slots: expected \[T=2, K\]"),
    (lambda a: a.update(slots=np.zeros((8, 2), np.int32).T), ValueError, r"slots: the last dimension must be contiguous"),
    (lambda a: a.update(lengths=np.zeros(3, np.int32)), ValueError, r"lengths: expected shape \[2\]"),
    (lambda a: a.update(sink=np.zeros(4, np.float64)), TypeError, r"sink: expected dtype float32"),
    (lambda a: a.update(cache=np.zeros((32, 1000), np.uint8)), ValueError, r"cache: a row of 1000 bytes"),
    (lambda a: a.update(cache=np.zeros(64, np.uint8)), ValueError, r"cache: expected \[num_slots, row\]"),
    (lambda a: a.update(cache=aligned_zeros((32, 576), np.uint8)), ValueError, r"scale: the fp8_tensor format needs"),
    (lambda a: a.update(out=np.zeros((2, 4, 256), np.uint16)), ValueError, r"out: expected shape \[2, 4, 512\]"),
    (lambda a: a.update(slots=[[0] * 8] * 2), TypeError, r"slots: expected a numpy.ndarray"),
    (lambda a: a.update(q="q"), TypeError, r"q_nope: expected a torch.Tensor or numpy.ndarray"),
])
def test_forward_argument_errors(mutate, exc, pattern):
    cache, q, slots = setup()
    a = dict(q=q, cache=cache, slots=slots, lengths=None, sink=None, out=None)
    mutate(a)
    with pytest.raises(exc, match=pattern):
        smla.forward(a["q"], None, a["cache"], a["slots"], lengths=a["lengths"],
                     sink=a["sink"], out=a["out"])


@pytest.mark.parametrize("sm_scale", [0.0, -0.04, float("nan"), float("inf")])
def test_forward_sm_scale_must_be_finite_and_positive(sm_scale):
    """0 would be uniform attention (a forgotten argument), < 0 attention to the least
    similar rows: the library refuses both, naming the argument."""
    cache, q, slots = setup()
    with pytest.raises(smla.SmlaError, match=r"sm_scale = .*must be finite and > 0"):
        smla.forward(q, None, cache, slots, sm_scale=sm_scale)


def test_c_library_names_the_argument():
    """Alignment and stride rules are the library's: its message names the field."""
    cache, q, slots = setup()
    raw = aligned_zeros((2 * 4 * 576 + 1,), np.uint16)
    q_mis = raw[1:].reshape(2, 4, 576)                 # 2-byte offset: misaligned
    with pytest.raises(smla.SmlaError) as e:
        smla.forward(q_mis, None, cache, slots)
    assert e.value.status_name == "SMLA_ERR_MISALIGNED" and "q_nope" in e.value.message
    with pytest.raises(smla.SmlaError, match="cache.row_bytes"):
        smla.forward(q, None, smla.KVCache(aligned_zeros((32, 1160), np.uint8)[:, :1152]),
                     slots)


def test_other_ops_name_their_arguments():
    with pytest.raises(TypeError, match=r"cache_write: slot: expected dtype int64"):
        smla.cache_write(np.zeros((2, 576), np.uint16), None, np.zeros(2, np.int32),
                         aligned_zeros((8, 1152), np.uint8))
    with pytest.raises(ValueError, match=r"cache_write: k_pe: expected shape \[2, 64\]"):
        smla.cache_write(np.zeros((2, 512), np.uint16), np.zeros((2, 32), np.uint16),
                         np.zeros(2, np.int64), aligned_zeros((8, 1152), np.uint8))
    with pytest.raises(ValueError, match=r"cache_write: cache: is read-only"):
        ro = aligned_zeros((8, 1152), np.uint8)
        ro.flags.writeable = False
        smla.cache_write(np.zeros((2, 576), np.uint16), None, np.zeros(2, np.int64), ro)
    with pytest.raises(ValueError, match=r"convert_indices: req_id: expected shape \[3\]"):
        smla.convert_indices(np.zeros(2, np.int32), np.zeros((1, 1), np.int32),
                             np.zeros((3, 4), np.int32), block_size=64)
    with pytest.raises(smla.SmlaError, match="block_size"):
        smla.convert_indices(np.zeros(3, np.int32), np.zeros((1, 1), np.int32),
                             np.zeros((3, 4), np.int32), block_size=0)
    with pytest.raises(ValueError, match=r"merge_states: lse_p: expected shape \[2, 3, 4\]"):
        smla.merge_states(np.zeros((2, 3, 4, 8), np.float32), np.zeros((2, 3, 5), np.float32))
    with pytest.raises(ValueError, match=r"merge_states: out_dtype"):
        smla.merge_states(np.zeros((2, 3, 4, 8), np.float32), np.zeros((2, 3, 4), np.float32),
                          out_dtype="int8")
    with pytest.raises(ValueError, match=r"build_metadata: query_start_loc: expected \[R \+ 1\]"):
        smla.build_metadata([0, 1], [3, 4], num_tokens=2, topk=8)
    with pytest.raises(ValueError, match="format"):
        smla.Plan(16, 64, format="fp4")
    with pytest.raises(smla.SmlaError, match="num_heads"):
        smla.Plan(129, 64)


def test_cuda_without_a_gpu_is_a_clear_error():
    if smla.has_cuda():
        try:
            n = _lib.lib.smla_cuda_device_count()
        except Exception:
            n = 0
        if n > 0:
            pytest.skip("a GPU is present")
    with pytest.raises(smla.SmlaError) as e:
        smla.Plan(16, 64, device="cuda:0")
    assert e.value.status_name in ("SMLA_ERR_NO_CUDA", "SMLA_ERR_NO_DEVICE")


def test_library_not_found_message(tmp_path):
    env = {"SMLA_LIBRARY": str(tmp_path / "nope.so"), "PATH": "/usr/bin:/bin",
           "PYTHONPATH": ":".join(p for p in sys.path if p)}
    r = subprocess.run([sys.executable, "-c", "import smla"], env=env, capture_output=True,
                       text=True)
    assert r.returncode != 0
    assert "cannot load libsmla" in r.stderr and "nope.so does not exist" in r.stderr
