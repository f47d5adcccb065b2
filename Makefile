# smla build. `make` builds the library (static + shared), the CLI and the tests;
# `make test` runs every test (GPU tests run when a GPU is present, else say skipped).
# CUDA is optional: found as nvcc on PATH or in /usr/local/cuda; `make CUDA=0` disables it.

PREFIX  ?= /usr/local
BUILD   ?= build
CC      ?= cc
ifeq ($(origin CC),default)
CC      := gcc
endif
CFLAGS  ?= -O2 -g
WARN    := -std=c11 -Wall -Wextra -Werror
CPPFLAGS_ALL := -Iinclude -Isrc -D_GNU_SOURCE
LDLIBS  := -lm -lpthread

VERSION_MAJOR := 0
VERSION       := 0.4.0

CUDA ?= auto
ifeq ($(CUDA),auto)
  NVCC := $(shell command -v nvcc 2>/dev/null || { test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc; })
else ifeq ($(CUDA),0)
  NVCC :=
else
  NVCC := $(CUDA)
endif

LIB_SRC := src/api.c src/metadata.c src/cpu/backend.c src/cpu/forward.c src/cpu/ops.c
CU_SRC  :=
ifneq ($(NVCC),)
  CUDA_HOME := $(patsubst %/bin/nvcc,%,$(NVCC))
  # For the sm90 objects' check below (skipped where the toolkit has no cuobjdump)
  CUOBJDUMP ?= $(CUDA_HOME)/bin/cuobjdump
  CU_SRC    := $(wildcard src/cuda/*.cu) $(wildcard src/cuda/sm90/*.cu)
  LIB_SRC   += src/cuda/backend.c
  CPPFLAGS_ALL += -DSMLA_HAVE_CUDA -I$(CUDA_HOME)/include
  CUDA_LIBDIR := $(CUDA_HOME)/lib64
  # The CUDA runtime is linked statically (libcudart_static.a; it finds the driver,
  # libcuda.so, with dlopen on first use): a CUDA build loads and runs its CPU backend on a
  # machine with no GPU, no driver and no CUDA libraries (smla_cuda_device_count() is 0
  # there, and smla_cuda_device_name says why). -lstdc++: nvcc-compiled objects carry C++
  # runtime references (static-init guards). The rpath serves the CLI's cuBLAS only.
  CUDA_LDLIBS := -L$(CUDA_LIBDIR) -Wl,-rpath,$(CUDA_LIBDIR) -lcudart_static -ldl -lrt -lstdc++
  # Generic kernels: sm_80 and newer (machine code for sm_80 and sm_90, PTX for the rest).
  # Hopper kernels (src/cuda/sm90/) add sm_90a.
  NVCC_GENCODE ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
                  -gencode arch=compute_80,code=compute_80
  NVCC_FLAGS ?= -O3 -std=c++17 -Xcompiler -fPIC,-Wall -Werror all-warnings -lineinfo
  # Kernel experiments switched on at build time, e.g. NVCC_EXTRA=-DSMLA_FWD90_V2=1 (use
  # another BUILD= folder to keep both builds).
  NVCC_EXTRA ?=
endif

OBJ := $(LIB_SRC:%.c=$(BUILD)/obj/%.o) $(CU_SRC:%.cu=$(BUILD)/obj/%.o)

# Switching CUDA on or off in one build folder rebuilds everything (the stamp is newer).
CONFIG_STAMP := $(BUILD)/config.$(if $(NVCC),cuda,cpu)
$(CONFIG_STAMP):
	@mkdir -p $(BUILD)
	@rm -f $(BUILD)/config.*
	@touch $@
$(OBJ): $(CONFIG_STAMP)

STATIC := $(BUILD)/libsmla.a
SHARED := $(BUILD)/libsmla.so.$(VERSION)
SONAME := libsmla.so.$(VERSION_MAJOR)

CLI   := $(BUILD)/smla
TESTS := $(BUILD)/test_smla
EXAMPLE := $(BUILD)/decode_step
# The gather-only microbenchmark (bench/gather.cu): Hopper copy paths, CUDA builds only.
GATHER := $(if $(NVCC),$(BUILD)/gather_bench)
# The S-only microbenchmark (bench/wgmma_s.cu): wgmma S of 64- and 32-row tiles, CUDA only.
WGMMA_S := $(if $(NVCC),$(BUILD)/wgmma_s_bench)
# The hand-off microbenchmark (bench/handoff.cu): mbarrier against named barrier, CUDA only.
HANDOFF := $(if $(NVCC),$(BUILD)/handoff_bench)

# NCCL, for the decode-context-parallel example (examples/dcp_nccl.c) only: NCCL_HOME with
# include/nccl.h and lib/ (or lib64/) libnccl.so*, else looked for beside CUDA and in
# /usr/local, /usr; NCCL=0 leaves the example out. The library never links NCCL.
DCP :=
ifneq ($(NVCC),)
ifneq ($(NCCL),0)
  NCCL_HOME ?= $(firstword $(foreach d,$(CUDA_HOME) /usr/local /usr,$(if $(wildcard $(d)/include/nccl.h),$(d))))
  ifneq ($(NCCL_HOME),)
    # The library beside the header first (a wheel ships only libnccl.so.2), the system's last,
    # so that header and library are of one NCCL.
    NCCL_LIB := $(firstword $(wildcard $(NCCL_HOME)/lib64/libnccl.so $(NCCL_HOME)/lib/libnccl.so \
                  $(NCCL_HOME)/lib/x86_64-linux-gnu/libnccl.so \
                  $(NCCL_HOME)/lib64/libnccl.so.2 $(NCCL_HOME)/lib/libnccl.so.2 \
                  /usr/lib/x86_64-linux-gnu/libnccl.so /usr/lib/x86_64-linux-gnu/libnccl.so.2))
    ifneq ($(NCCL_LIB),)
      DCP := $(BUILD)/dcp_nccl
    endif
  endif
endif
endif

.PHONY: all lib test test-c test-python bench plot install clean sanitize fuzz mutants mutants-gpu
.DEFAULT_GOAL := all
all: lib $(CLI) $(TESTS) $(EXAMPLE) $(DCP) $(GATHER) $(WGMMA_S) $(HANDOFF)
lib: $(STATIC) $(SHARED) $(BUILD)/libsmla.so

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(WARN) $(CFLAGS) $(EXTRA_CFLAGS) -fPIC -pthread $(CPPFLAGS_ALL) -MMD -MP -c $< -o $@

# The CPU forward's inner products: fused multiply-add (ISO C mode turns contraction off)
# and the full vectorizer. -Wno-psabi: the 8-float vector helpers are static, no ABI crosses.
$(BUILD)/obj/src/cpu/forward.o: EXTRA_CFLAGS := -O3 -ffp-contract=fast -Wno-psabi

# ptxas only informs (C7520 and kin) when it serializes every wgmma of a kernel (the accumulators
# touched in a divergent path): a build that did so measured 40% slower (bench/RESULTS.md
# session 14 call 1), so here it is an error. It may also serialize them without a word (a
# wgmma.wait_group 1 in the loop did, session 14 call 3): so the machine code is counted
# too, a wait (WARPGROUP.DEPBAR) for every few wgmma (HGMMA) failing the build.
$(BUILD)/obj/src/cuda/sm90/%.o: src/cuda/sm90/%.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) $(NVCC_EXTRA) -gencode arch=compute_90a,code=sm_90a $(CPPFLAGS_ALL) -MMD -MP -c $< -o $@ 2>$@.ptxas || { cat $@.ptxas >&2; exit 1; }
	@cat $@.ptxas >&2; if grep -q "wgmma.mma_async instructions are serialized" $@.ptxas; then \
	  echo "error: ptxas serialized the wgmma of $< (see above)" >&2; rm -f $@; exit 1; fi
	@if [ -n "$(CUOBJDUMP)" ] && command -v "$(CUOBJDUMP)" >/dev/null 2>&1; then \
	  "$(CUOBJDUMP)" -sass $@ > $@.sass || { rm -f $@; exit 1; }; \
	  n=$$(grep -c HGMMA $@.sass); w=$$(grep -c WARPGROUP.DEPBAR $@.sass); \
	  if [ $$((4 * w)) -gt $$n ]; then echo "error: $<: $$w wgmma waits for $$n wgmma in the" \
	    "machine code: ptxas serialized them (without C7520)" >&2; rm -f $@; exit 1; fi; \
	else echo "note: $<: machine-code check of the wgmma skipped (no cuobjdump;" \
	  "CUOBJDUMP=path to run it)" >&2; fi

$(BUILD)/obj/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) $(NVCC_EXTRA) $(NVCC_GENCODE) $(CPPFLAGS_ALL) -MMD -MP -c $< -o $@

$(STATIC): $(OBJ)
	@rm -f $@
	ar rcs $@ $^

# Relinked when the Makefile changes (e.g. how the CUDA runtime is linked).
$(SHARED): $(OBJ) Makefile
	$(CC) -shared -Wl,-soname,$(SONAME) -o $@ $(OBJ) $(CUDA_LDLIBS) $(LDLIBS)

$(BUILD)/libsmla.so: $(SHARED)
	ln -sf libsmla.so.$(VERSION) $(BUILD)/$(SONAME)
	ln -sf libsmla.so.$(VERSION) $@

# Programs link the static library, so they run from the build tree without LD_LIBRARY_PATH.
PROG_LDLIBS = $(STATIC) $(CUDA_LDLIBS) $(LDLIBS)

# Files named *_cuda.c call the CUDA runtime (and cuBLAS) directly: built only with CUDA.
ifneq ($(NVCC),)
  CLI_SRC  := $(wildcard tools/*.c)
  TEST_SRC := $(wildcard tests/*.c)
  CLI_LDLIBS := -lcublas
else
  CLI_SRC  := $(filter-out %_cuda.c,$(wildcard tools/*.c))
  TEST_SRC := $(filter-out %_cuda.c,$(wildcard tests/*.c))
endif

$(CLI): $(CLI_SRC) $(wildcard tools/*.h) $(STATIC)
	$(CC) $(WARN) $(CFLAGS) -pthread $(CPPFLAGS_ALL) $(CLI_SRC) -o $@ $(STATIC) $(CUDA_LDLIBS) $(CLI_LDLIBS) $(LDLIBS)

$(TESTS): $(TEST_SRC) $(wildcard tests/*.h) $(STATIC)
	$(CC) $(WARN) $(CFLAGS) -pthread $(CPPFLAGS_ALL) $(TEST_SRC) -o $@ $(PROG_LDLIBS)

$(EXAMPLE): examples/decode_step.c $(STATIC)
	$(CC) $(WARN) $(CFLAGS) -Iinclude examples/decode_step.c -o $@ $(PROG_LDLIBS)

$(GATHER): bench/gather.cu bench/bench_ck.cuh
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) -gencode arch=compute_90a,code=sm_90a $< -o $@

$(WGMMA_S): bench/wgmma_s.cu bench/bench_ck.cuh src/cuda/sm90/wgmma.cuh
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) -gencode arch=compute_90a,code=sm_90a $< -o $@

$(HANDOFF): bench/handoff.cu bench/bench_ck.cuh src/cuda/sm90/wgmma.cuh
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) -gencode arch=compute_90a,code=sm_90a $< -o $@

$(DCP): examples/dcp_nccl.c $(STATIC)
	$(CC) $(WARN) $(CFLAGS) -Iinclude -I$(CUDA_HOME)/include -I$(NCCL_HOME)/include examples/dcp_nccl.c -o $@ \
	  $(PROG_LDLIBS) $(NCCL_LIB) -Wl,-rpath,$(dir $(NCCL_LIB))

test: test-c test-python

# The DCP example with one rank per visible GPU (NCCL), then four ranks simulated on GPU 0
# (it says SKIPPED without a GPU).
test-c: all
	$(TESTS)
	$(EXAMPLE)
	bash scripts/cli_smoke.sh $(CLI)
	$(if $(DCP),timeout 600 $(DCP) && timeout 600 $(DCP) --simulate --ranks 4 --interleave 16,@echo "dcp_nccl: not built (no NCCL found; NCCL_HOME=...)")

# The Python binding's tests (python/tests): numpy on the CPU always; with torch also the
# torch CPU tests, and with a GPU the CUDA ones (each skipped case says why).
# PYTHON=/path/to/python picks the interpreter (e.g. a venv with torch).
PYTHON ?= python3
test-python: lib
	@if [ ! -d python/tests ]; then echo "python tests: none yet"; \
	elif $(PYTHON) -c 'import numpy, pytest' 2>/dev/null; then \
	  SMLA_LIBRARY=$(abspath $(BUILD)/libsmla.so) PYTHONPATH=$(abspath python) $(PYTHON) -m pytest -q -rs python/tests; \
	else echo "python tests: SKIPPED (numpy and pytest not installed; .ci/run installs them)"; fi

# The mutation check (scripts/mutants.py): each deliberate bug in a copy of the tree must
# fail the tests. `make mutants` runs the CPU ones (as CI does), `make mutants-gpu` those
# of the CUDA kernels (needs a GPU).
mutants:
	$(PYTHON) scripts/mutants.py
mutants-gpu:
	$(PYTHON) scripts/mutants.py --target gpu

bench: $(CLI)
	$(CLI) bench

plot:
	@test -n "$(JSON)" || { echo "usage: make plot JSON=bench.json [PNG=bench.png]"; exit 2; }
	bench/plot.sh $(JSON) $(or $(PNG),$(JSON:.json=.png))

# CPU library and tests under AddressSanitizer + UndefinedBehaviorSanitizer.
sanitize:
	$(MAKE) CUDA=0 BUILD=build-asan CFLAGS="-O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all" \
	  LDLIBS="-lm -lpthread -fsanitize=address,undefined" build-asan/test_smla
	build-asan/test_smla

# libFuzzer target over the host entry points (clang; Debian's libclang-rt-14-dev).
FUZZ_CC ?= clang
FUZZ_SECONDS ?= 60
$(BUILD)/fuzz_api: fuzz/fuzz_api.c $(filter-out src/cuda/%,$(LIB_SRC)) $(wildcard src/*.h src/cpu/*.h include/*.h)
	@mkdir -p $(BUILD)
	$(FUZZ_CC) -std=c11 -Wall -Wextra -Werror -Wno-psabi -O1 -g -fsanitize=fuzzer,address,undefined \
	  -fno-sanitize-recover=all -Iinclude -Isrc -D_GNU_SOURCE fuzz/fuzz_api.c \
	  $(filter-out src/cuda/%,$(LIB_SRC)) -o $@ -lm -lpthread
fuzz: $(BUILD)/fuzz_api
	@mkdir -p $(BUILD)/fuzz-corpus
	$(BUILD)/fuzz_api -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 $(BUILD)/fuzz-corpus fuzz/corpus

install: lib $(CLI)
	install -d $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/lib/pkgconfig $(DESTDIR)$(PREFIX)/bin
	install -m 644 include/smla.h $(DESTDIR)$(PREFIX)/include/
	install -m 644 $(STATIC) $(DESTDIR)$(PREFIX)/lib/
	install -m 755 $(SHARED) $(DESTDIR)$(PREFIX)/lib/
	ln -sf libsmla.so.$(VERSION) $(DESTDIR)$(PREFIX)/lib/$(SONAME)
	ln -sf $(SONAME) $(DESTDIR)$(PREFIX)/lib/libsmla.so
	install -m 755 $(CLI) $(DESTDIR)$(PREFIX)/bin/
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@VERSION@|$(VERSION)|g' \
	    -e 's|@LIBS_PRIVATE@|$(CUDA_LDLIBS) $(LDLIBS)|g' smla.pc.in > $(DESTDIR)$(PREFIX)/lib/pkgconfig/smla.pc
	@# the loader's cache, where this is the system (pkg-config's Libs also carry an rpath)
	@if [ -z "$(DESTDIR)" ] && [ -w /etc/ld.so.cache ] && command -v ldconfig >/dev/null; then ldconfig; fi

clean:
	rm -rf $(BUILD) build-asan

-include $(OBJ:.o=.d)
