# topos - top-level build.  `make` builds the libraries and examples,
# `make test` runs every Check suite, `make deps` installs what is missing.
# Outputs live under $(BUILD) (build/ by default; build/asan for `make asan`).

BUILD   ?= build
CC      ?= cc
OPT     ?= -O2
SAN     ?=
PKG_CHECK := $(shell pkg-config --cflags --libs check 2>/dev/null || echo -lcheck -lsubunit -lrt -lm -lpthread)
CJSON_CFLAGS := $(shell pkg-config --cflags libcjson 2>/dev/null || echo -I/usr/include/cjson)
GRPC_LIBS := $(shell pkg-config --libs grpc libprotobuf-c 2>/dev/null || echo -lgrpc -lgpr -lprotobuf-c)
# Describe's SVG format: Graphviz's layout and renderer (server/svg.c).
GVC_LIBS := $(shell pkg-config --libs libgvc 2>/dev/null || echo -lgvc -lcgraph -lcdt)
# The HTTP gateway: libuv's loop, http-parser (no pkg-config file).
HTTP_LIBS := $(shell pkg-config --libs libuv 2>/dev/null || echo -luv) -lhttp_parser
# The gateway's TLS (and the tests' HTTPS client): OpenSSL's libssl.
TLS_LIBS := -lssl
# toposd's readiness and watchdog notifications to systemd (server/notify.c).
SYSTEMD_LIBS := $(shell pkg-config --libs libsystemd 2>/dev/null || echo -lsystemd)

# Public structs grow at the end (topos_entry's `threads`): a positional
# initialiser that stops early still means 0 for the rest, as C says.
WARN    := -Wall -Wextra -Werror -Werror=implicit-function-declaration \
           -Wno-unused-parameter -Wno-missing-field-initializers
# Not -fvect-cost-model=dynamic: it vectorises the reference's elementwise
# and column-sum loops, and a vectorised commutative add or multiply may
# take its operands in either order, which changes which NaN comes out
# when both are NaN (the backends' bit tests caught it; docs/decisions.md).
# The reference kernels must never fuse a multiply and an add on their own:
# numerics.md allows FMA only where it writes fma().
# -fvisibility=hidden: the shared libraries export only what the public
# headers mark TOPOS_API (tests/engine/test_install.c checks).
CFLAGS_BASE := -std=c17 $(OPT) -g $(WARN) -ffp-contract=off \
           -fno-fast-math \
           -fPIC -fvisibility=hidden -D_GNU_SOURCE -pthread $(CJSON_CFLAGS) \
           $(SAN) $(EXTRA_CFLAGS)
# Include paths by layer: engine; backends, store and proto over it;
# client over proto; server over all but client.  A layer's objects see its
# own headers and those below it only (the object rule), so an engine file
# that reached for store.h, or wire.c for a server header, does not
# compile.  Programs, tests and benches (CFLAGS) see every layer.
INC_ENGINE   := -Iengine
INC_BACKENDS := $(INC_ENGINE) -Ibackends
INC_STORE    := $(INC_ENGINE) -Istore
INC_PROTO    := $(INC_ENGINE) -Iproto -I$(BUILD)/gen
INC_CLIENT   := $(INC_PROTO) -Iclient
INC_SERVER   := $(INC_ENGINE) -Ibackends -Istore -Iproto -I$(BUILD)/gen
INC_ALL      := $(INC_ENGINE) -Ibackends -Istore -Iproto -Iclient -I$(BUILD)/gen
CFLAGS  := $(CFLAGS_BASE) $(INC_ALL)
# The engine hashes with OpenSSL's libcrypto and writes JSON with cJSON;
# the store adds SQLite.
LDLIBS  := -lcjson -lcrypto -lm -pthread $(SAN)
STORE_LIBS := -lsqlite3

ENGINE_SRC := $(sort $(wildcard engine/*.c))
ENGINE_OBJ := $(ENGINE_SRC:%.c=$(BUILD)/obj/%.o)
# Execution backends (backends/): a library of their own; programs opt in
# by calling topos_backends_register_defaults() (backends/backends.h).
# backends/cuda/'s device-memory bookkeeping (the buffer pool, the blob
# cache, operand spans) is plain C, tested on any host: it lives here too.
BACKEND_SRC := $(sort $(wildcard backends/*.c) $(wildcard backends/cuda/devpool.c \
                 backends/cuda/blobcache.c backends/cuda/span.c))
BACKEND_OBJ := $(BACKEND_SRC:%.c=$(BUILD)/obj/%.o)
LIB_BACKENDS := $(BUILD)/lib/libtopos_backends.a
BACKEND_LIBS := $(if $(wildcard backends/blas.c),-lopenblas) -ldl

# The CUDA plugin (backends/cuda/): build/lib/libtopos_cuda.so, loaded at
# run time by topos_backends_register_defaults() (backends/defaults.c), so
# programs start on hosts without CUDA.  Built when nvcc is found (on PATH
# or under CUDA_HOME); `make CUDA=0` leaves it out.  The static CUDA
# runtime; cuBLAS is opened at run time once a device is found; kernels for sm_80 and sm_90, plus PTX that
# newer GPUs compile at load time.
CUDA_HOME ?= /usr/local/cuda
NVCC ?= $(firstword $(shell command -v nvcc 2>/dev/null) $(wildcard $(CUDA_HOME)/bin/nvcc))
CUDA ?= $(if $(NVCC),1,0)
CUDA_ARCHS ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
              -gencode arch=compute_90,code=compute_90
CUDA_SO := $(BUILD)/lib/libtopos_cuda.so
CUDA_HOST_SRC := backends/cuda/plugin.c backends/cuda/devpool.c \
                 backends/cuda/blobcache.c backends/cuda/span.c
CUDA_HOST_OBJ := $(CUDA_HOST_SRC:%.c=$(BUILD)/obj/cuda-plugin/%.o)
CUDA_KERNEL_OBJ := $(BUILD)/obj/cuda-plugin/backends/cuda/kernels.o
PLUGINS := $(if $(filter 1,$(CUDA)),$(CUDA_SO))
# A pretend device plugin for the daemon's tests (tests/cuda/fake_plugin.c).
FAKE_PLUGIN := $(BUILD)/lib/libtopos_fakegpu.so
# The backends plus the engine, for every program that links both.
ENGINE_LINK = $(if $(BACKEND_SRC),$(LIB_BACKENDS)) $(LIB_A) $(BACKEND_LIBS)

STORE_SRC  := $(sort $(wildcard store/*.c))
STORE_OBJ  := $(STORE_SRC:%.c=$(BUILD)/obj/%.o)
# The daemon side: generated protobuf-c code, the wire glue, the client
# library, the daemon and the CLI.
PROTOS     := topos health
GEN_C      := $(PROTOS:%=$(BUILD)/gen/%.pb-c.c)
GEN_H      := $(PROTOS:%=$(BUILD)/gen/%.pb-c.h)
CLIENT_SRC := $(sort $(wildcard proto/*.c) $(filter-out client/cli.c,$(wildcard client/*.c)))
CLIENT_OBJ := $(CLIENT_SRC:%.c=$(BUILD)/obj/%.o) $(PROTOS:%=$(BUILD)/obj/gen/%.pb-c.o)
SERVER_SRC := $(sort $(wildcard server/*.c))
SERVER_OBJ := $(SERVER_SRC:%.c=$(BUILD)/obj/%.o)
LIB_CLIENT := $(BUILD)/lib/libtoposclient.a
TOPOSD     := $(BUILD)/bin/toposd
TOPOS_CLI  := $(BUILD)/bin/topos
BINS       := $(if $(SERVER_SRC),$(TOPOSD)) $(if $(wildcard client/cli.c),$(TOPOS_CLI))

TEST_SRC   := $(sort $(wildcard tests/engine/test_*.c tests/backends/test_*.c tests/store/test_*.c tests/daemon/test_*.c tests/examples/test_*.c))
# The CUDA cases and their reference loops: run by the cuda suite here
# (skipped without a device) and by the standalone device check.
# The CUDA kernels themselves also run here, on a CPU simulator
# (tests/cuda/sim.h): kernels.cu compiled as C++.
SIM_OBJ    := $(BUILD)/obj/tests/cuda/kernels_sim.o $(BUILD)/obj/tests/cuda/sim.o
TEST_OBJ   := $(TEST_SRC:%.c=$(BUILD)/obj/%.o) $(BUILD)/obj/tests/cuda/ref.o \
              $(BUILD)/obj/tests/cuda/cases.o $(SIM_OBJ)
CXXFLAGS_SIM = -std=c++17 $(OPT) -g -Wall -Wextra -Werror -Wno-unknown-pragmas \
               -Wno-unused-parameter -ffp-contract=off -fno-fast-math -fPIC $(SAN)
SUITES     := $(patsubst test_%.c,%,$(notdir $(TEST_SRC)))
# What the examples share (examples/common: flags, where steps run,
# checkpoints, data loaders, progress and metrics) is a library of its
# own, linked by the examples, their tests and the benches.
EXLIB_SRC  := $(sort $(wildcard examples/common/*.c))
EXLIB_OBJ  := $(EXLIB_SRC:%.c=$(BUILD)/obj/%.o)
LIB_EX     := $(BUILD)/lib/libtopos_examples.a
EXLIB_LIBS := -lz
# Every training example: examples/<dir>/<name>.c and examples/<name>.c
# (but inspect, which links the engine alone) build $(BUILD)/examples/<name>.
TRAIN_EXAMPLE_SRC := $(sort $(filter-out examples/inspect.c,$(wildcard examples/*.c)) \
                     $(wildcard examples/makemore/*.c examples/mnist/*.c examples/cifar10/*.c \
                                examples/gpt2/*.c examples/llama/*.c))
TRAIN_EXAMPLES := $(foreach f,$(TRAIN_EXAMPLE_SRC),$(BUILD)/examples/$(basename $(notdir $(f))))
EXAMPLES   := $(TRAIN_EXAMPLES) $(BUILD)/examples/inspect

# The version is topos.h's; the shared libraries' SONAMEs carry its major
# number (libtopos.so.0 -> libtopos.so.0.1.0).
VERSION := $(shell sed -n 's/^\#define TOPOS_VERSION "\(.*\)"/\1/p' engine/topos.h)
MAJOR   := $(firstword $(subst ., ,$(VERSION)))
LIB_A  := $(BUILD)/lib/libtopos.a
LIB_SO := $(BUILD)/lib/libtopos.so.$(VERSION)
SO_BACKENDS := $(BUILD)/lib/libtopos_backends.so.$(VERSION)
SO_CLIENT   := $(BUILD)/lib/libtoposclient.so.$(VERSION)
SHARED_LIBS := $(LIB_SO) $(if $(BACKEND_SRC),$(SO_BACKENDS)) $(if $(CLIENT_SRC),$(SO_CLIENT))
LIB_STORE := $(BUILD)/lib/libtopos_store.a
RUNNER := $(BUILD)/tests/topos_tests

.PHONY: all test asan test-valgrind deps bench-deps clean format lint examples fuzz bench run soak \
        install uninstall
all: $(LIB_A) $(SHARED_LIBS) $(LIB_STORE) $(LIB_CLIENT) $(if $(BACKEND_SRC),$(LIB_BACKENDS)) $(BINS) $(PLUGINS) examples

examples: $(EXAMPLES)

$(BUILD)/obj/%.o: %.c $(wildcard engine/*.h backends/*.h backends/cuda/*.h bench/*.h store/*.h proto/*.h client/*.h server/*.h examples/common/*.h tests/engine/*.h tests/daemon/*.h tests/examples/*.h tests/cuda/*.h) $(GEN_H)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(LAYER_INC) -c $< -o $@

# Each object's include paths are its layer's (see INC_*); an object of no
# layer gets none and fails to compile rather than see everything.
$(BUILD)/obj/engine/%.o:   LAYER_INC = $(INC_ENGINE)
$(BUILD)/obj/backends/%.o: LAYER_INC = $(INC_BACKENDS)
$(BUILD)/obj/store/%.o:    LAYER_INC = $(INC_STORE)
$(BUILD)/obj/proto/%.o:    LAYER_INC = $(INC_PROTO)
$(BUILD)/obj/client/%.o:   LAYER_INC = $(INC_CLIENT)
$(BUILD)/obj/server/%.o:   LAYER_INC = $(INC_SERVER)
# The CLI is a program, not the library: it lists the backends too, and
# administers tenants and tokens in the store.
$(BUILD)/obj/client/cli.o: LAYER_INC = $(INC_CLIENT) -Ibackends -Istore
# Tests reach into every layer, and share tests/engine's helpers.
# TOPOS_TEST_SAN: the sanitizer flags, for the install suite's outside
# program (linked against sanitized shared libraries under `make asan`).
$(BUILD)/obj/tests/%.o:    LAYER_INC = $(INC_ALL) -Itests/engine -Iexamples/common -Itests/cuda \
                                       -DTOPOS_TEST_SAN='"$(SAN)"' 
# The examples' library is a program-side layer: it sees everything.
$(BUILD)/obj/examples/%.o: LAYER_INC = $(INC_ALL) -Ibackends -Iexamples/common \
                                       -DTOPOS_SOURCE_DIR='"$(CURDIR)"'

# Kept: a pattern rule's outputs would otherwise be intermediate files.
.SECONDARY: $(GEN_C) $(GEN_H)
$(BUILD)/gen/%.pb-c.c $(BUILD)/gen/%.pb-c.h: proto/%.proto
	@mkdir -p $(BUILD)/gen
	protoc-c --c_out=$(BUILD)/gen -Iproto $<

# Generated code is compiled without -Werror: its warnings are protoc-c's.
$(BUILD)/obj/gen/%.pb-c.o: $(BUILD)/gen/%.pb-c.c $(GEN_H)
	@mkdir -p $(dir $@)
	$(CC) -std=c17 $(OPT) -g -fPIC -fvisibility=hidden -I$(BUILD)/gen $(SAN) -c $< -o $@

$(LIB_CLIENT): $(CLIENT_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(TOPOSD): $(SERVER_OBJ) $(LIB_CLIENT) $(LIB_STORE) $(LIB_A) $(if $(BACKEND_SRC),$(LIB_BACKENDS))
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(SERVER_OBJ) -o $@ $(LIB_CLIENT) $(LIB_STORE) $(ENGINE_LINK) \
	  $(GRPC_LIBS) $(HTTP_LIBS) $(TLS_LIBS) $(GVC_LIBS) $(SYSTEMD_LIBS) $(STORE_LIBS) $(LDLIBS)

# The gateway carries its OpenAPI document (.incbin).
$(BUILD)/obj/server/gateway.o: server/openapi.json

# The CLI links the backends too: `topos backends --local` lists them.
# The CLI's tenant and token commands work on the store file (store/).
$(TOPOS_CLI): $(BUILD)/obj/client/cli.o $(LIB_CLIENT) $(LIB_STORE) $(LIB_A) $(if $(BACKEND_SRC),$(LIB_BACKENDS))
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $< -o $@ $(LIB_CLIENT) $(LIB_STORE) $(ENGINE_LINK) $(GRPC_LIBS) $(STORE_LIBS) $(LDLIBS)

# `make run`: the daemon in the foreground on loopback, store under ./var.
run: $(TOPOSD)
	@mkdir -p var
	$(TOPOSD) --listen 127.0.0.1:50051 --http 127.0.0.1:8080 --store var/topos.db

$(LIB_A): $(ENGINE_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

# Shared libraries: SONAME libNAME.so.$(MAJOR), the two links beside
# them, nothing left undefined but what the named libraries provide.
# The backends and the client link the engine's shared library.
SO_STEM = $(firstword $(subst .so., ,$(notdir $@))).so
SO_LINK = $(CC) -shared -Wl,-soname,$(SO_STEM).$(MAJOR) -Wl,--no-undefined -o $@
SO_NAMES = cd $(dir $@) && ln -sf $(notdir $@) $(SO_STEM).$(MAJOR) && \
	   ln -sf $(SO_STEM).$(MAJOR) $(SO_STEM)
$(LIB_SO): $(ENGINE_OBJ)
	@mkdir -p $(dir $@)
	$(SO_LINK) $^ $(LDLIBS)
	$(SO_NAMES)
$(SO_BACKENDS): $(BACKEND_OBJ) $(LIB_SO)
	$(SO_LINK) $(BACKEND_OBJ) $(LIB_SO) $(BACKEND_LIBS) $(LDLIBS)
	$(SO_NAMES)
$(SO_CLIENT): $(CLIENT_OBJ) $(LIB_SO)
	$(SO_LINK) $(CLIENT_OBJ) $(LIB_SO) $(GRPC_LIBS) $(LDLIBS)
	$(SO_NAMES)

# `make install` / `make uninstall` (tools/install.sh): headers under
# $(PREFIX)/include/topos, the libraries (shared, with their SONAME links,
# and static), pkg-config files topos, topos-backends and topos-client,
# topos in bin, toposd in sbin, the CUDA plugin in lib/topos, the man
# pages.  DESTDIR stages the tree (packaging); the .pc files name PREFIX.
PREFIX ?= /usr/local
LIBDIR ?= $(PREFIX)/lib
INSTALL_ENV = BUILD='$(BUILD)' PREFIX='$(PREFIX)' LIBDIR='$(LIBDIR)' DESTDIR='$(DESTDIR)' \
	      VERSION='$(VERSION)' MAJOR='$(MAJOR)'
install: all
	@$(INSTALL_ENV) sh tools/install.sh install
uninstall:
	@$(INSTALL_ENV) sh tools/install.sh uninstall

$(LIB_BACKENDS): $(BACKEND_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

# The plugin's objects: hidden symbols but its entry point, the host side
# compiled against the CUDA headers, the kernels by nvcc without
# contraction (-fmad=false: numerics.md's fma only where it is written).
$(BUILD)/obj/cuda-plugin/%.o: %.c $(wildcard engine/*.h backends/*.h backends/cuda/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(INC_BACKENDS) -Ibackends/cuda -I$(CUDA_HOME)/include \
	  -fvisibility=hidden -c $< -o $@
$(CUDA_KERNEL_OBJ): backends/cuda/kernels.cu $(wildcard backends/cuda/*.h)
	@mkdir -p $(dir $@)
	$(NVCC) -std=c++17 -O3 -fmad=false $(CUDA_ARCHS) -Ibackends/cuda \
	  -Xcompiler -fPIC,-fvisibility=hidden -c $< -o $@
$(CUDA_SO): $(CUDA_HOST_OBJ) $(CUDA_KERNEL_OBJ)
	@mkdir -p $(dir $@)
	$(CC) -shared -o $@ $^ -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 \
	  -lcudart_static -ldl -lrt -lpthread -lstdc++ -lm $(SAN)

$(FAKE_PLUGIN): tests/cuda/fake_plugin.c backends/plugin.h engine/backend.h engine/topos.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(INC_BACKENDS) -fvisibility=hidden -shared $< -o $@
$(BUILD)/obj/tests/cuda/kernels_sim.o: backends/cuda/kernels.cu $(wildcard backends/cuda/*.h tests/cuda/*.h)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS_SIM) -DTOPOS_CUDA_SIM -Itests/cuda -Ibackends/cuda -x c++ -c $< -o $@
$(BUILD)/obj/tests/cuda/sim.o: tests/cuda/sim.cc tests/cuda/sim.h
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS_SIM) -Itests/cuda -c $< -o $@

$(LIB_STORE): $(STORE_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/examples/inspect: examples/inspect.c $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $< -o $@ $(LIB_A) $(LDLIBS)

EXAMPLE_LIBS = $(if $(CLIENT_SRC),$(LIB_CLIENT)) $(ENGINE_LINK) \
                $(if $(CLIENT_SRC),$(GRPC_LIBS)) $(LDLIBS)

$(LIB_EX): $(EXLIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

# One rule per training example: its source, linked with the examples'
# library, the client and the engine.
define TRAIN_EXAMPLE_RULE
$(BUILD)/examples/$(basename $(notdir $(1))): $(1) $(LIB_EX) $(LIB_A) $(if $(CLIENT_SRC),$(LIB_CLIENT)) $(if $(BACKEND_SRC),$(LIB_BACKENDS))
	@mkdir -p $$(dir $$@)
	$$(CC) $$(CFLAGS) -Iexamples/common -DTOPOS_SOURCE_DIR='"$$(CURDIR)"' $$< -o $$@ $$(LIB_EX) $$(EXAMPLE_LIBS) $$(EXLIB_LIBS)
endef
$(foreach f,$(TRAIN_EXAMPLE_SRC),$(eval $(call TRAIN_EXAMPLE_RULE,$(f))))

# The runner registers one Check suite per tests/*/test_<name>.c, each
# of which defines `Suite *<name>_suite(void)`.
$(BUILD)/tests/suites.c: $(TEST_SRC) Makefile
	@mkdir -p $(dir $@)
	@{ echo '#include <check.h>'; \
	   for s in $(SUITES); do echo "Suite *$${s}_suite(void);"; done; \
	   echo 'void add_suites(SRunner *r);'; \
	   echo 'void add_suites(SRunner *r) {'; \
	   for s in $(SUITES); do echo "  srunner_add_suite(r, $${s}_suite());"; done; \
	   echo '}'; } > $@

$(RUNNER): $(TEST_OBJ) $(BUILD)/tests/suites.c tests/runner.c $(LIB_A) $(SHARED_LIBS) $(LIB_STORE) $(LIB_EX) $(EXAMPLES) $(if $(CLIENT_SRC),$(LIB_CLIENT)) $(if $(BACKEND_SRC),$(LIB_BACKENDS)) $(BINS) $(PLUGINS) $(FAKE_PLUGIN)
	$(CC) $(CFLAGS) -Itests/engine $(TEST_OBJ) $(BUILD)/tests/suites.c tests/runner.c \
	  -o $@ $(LIB_EX) $(if $(CLIENT_SRC),$(LIB_CLIENT)) $(LIB_STORE) $(ENGINE_LINK) $(PKG_CHECK) \
	  $(if $(CLIENT_SRC),$(GRPC_LIBS)) $(TLS_LIBS) $(GVC_LIBS) $(STORE_LIBS) $(EXLIB_LIBS) $(LDLIBS) -lstdc++

test: $(RUNNER)
	TOPOS_BUILD=$(BUILD) $(RUNNER)

# Sanitized code runs several times slower; Check's per-test timeouts are
# hang guards, so they stretch with it.
asan:
	CK_TIMEOUT_MULTIPLIER=4 \
	LSAN_OPTIONS=suppressions=$(CURDIR)/tools/lsan.supp:print_suppressions=0 \
	  $(MAKE) BUILD=build/asan OPT=-O1 \
	  SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all" test

# Valgrind runs the engine suites in one process (no fork) and fails on
# any definite or indirect leak; the slow example runs are skipped.
test-valgrind:
	$(MAKE) BUILD=build/valgrind OPT=-O1 build/valgrind/tests/topos_tests
	CK_FORK=no TOPOS_SKIP_SLOW=1 TOPOS_BUILD=build/valgrind valgrind --quiet \
	  --leak-check=full --errors-for-leak-kinds=definite,indirect \
	  --show-leak-kinds=definite,indirect --error-exitcode=1 \
	  build/valgrind/tests/topos_tests

# IREE, for the suite that compiles and runs emitted StableHLO
# (tests/engine/test_iree.c): `make deps` (tools/deps.sh) installs its
# compiler and runtime into this virtual environment, and every recipe
# (the test runner's included, under `make asan` too) finds the tools
# through TOPOS_IREE_BIN.  Without them the suite says so and skips.
export IREE_VENV ?= $(CURDIR)/.iree-venv
export TOPOS_IREE_BIN ?= $(IREE_VENV)/bin
export SCHEMATHESIS_VENV ?= $(CURDIR)/.schemathesis-venv
# PyTorch from PyPI, bench/train's second PyTorch build: `make
# bench-deps` (tools/torch-venv.sh) installs it here, and bench/train
# finds its python through TORCH_VENV.
export TORCH_VENV ?= $(CURDIR)/.torch-venv

deps:
	@sh tools/deps.sh

# The two PyTorch builds bench/train runs side by side (docs/bench.md):
# Debian's python3-torch, run with /usr/bin/python3 (also the GPT-2 and
# Llama suites' reference models, so `make deps` installs it too), and a
# current torch from PyPI in $(TORCH_VENV) (tools/torch-venv.sh; ~5 GB,
# which only this target installs).  Idempotent like tools/deps.sh:
# nothing happens when both are present at their pins.
bench-deps:
	@dpkg -s python3-torch >/dev/null 2>&1 || { \
	  echo "make bench-deps: installing python3-torch"; \
	  SUDO=""; if [ "$$(id -u)" -ne 0 ]; then SUDO="sudo"; fi; \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq \
	    --no-install-recommends python3-torch; }
	@sh tools/torch-venv.sh

# Benchmarks print tables of figures measured side by side in one run.
# bench/soak.c runs for minutes: `make soak`, not `make bench`.
BENCH_SRC := $(filter-out bench/soak.c,$(sort $(wildcard bench/*.c)))
BENCH_BIN := $(patsubst bench/%.c,$(BUILD)/bench/%,$(BENCH_SRC))
$(BUILD)/bench/%: bench/%.c $(wildcard bench/*.h) $(LIB_A) $(LIB_STORE) $(if $(BACKEND_SRC),$(LIB_BACKENDS))
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $< -o $@ $(LIB_STORE) $(ENGINE_LINK) $(STORE_LIBS) $(LDLIBS)
# The training bench builds makemore's transformer and loads Fashion-MNIST
# with the examples' library.
$(BUILD)/bench/train: bench/train.c $(wildcard bench/*.h examples/common/*.h) $(LIB_A) $(LIB_STORE) $(LIB_EX) $(if $(BACKEND_SRC),$(LIB_BACKENDS))
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Iexamples/common $< -o $@ $(LIB_EX) $(LIB_STORE) $(ENGINE_LINK) $(STORE_LIBS) $(EXLIB_LIBS) $(LDLIBS)
# The GPT-2 bench runs the examples' GPT-2 (examples/common/gpt2.c and its
# decoder.c, which also links the client for remote steps).
$(BUILD)/bench/gpt2: bench/gpt2.c $(wildcard bench/*.h examples/common/*.h) $(LIB_A) $(LIB_EX) $(if $(CLIENT_SRC),$(LIB_CLIENT)) $(if $(BACKEND_SRC),$(LIB_BACKENDS))
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Iexamples/common $< -o $@ $(LIB_EX) $(EXAMPLE_LIBS) $(EXLIB_LIBS)
# The daemon bench talks gRPC and starts its own toposd.
# Its in-process side registers the backends toposd registers.
$(BUILD)/bench/daemon: bench/daemon.c $(LIB_CLIENT) $(LIB_A) $(TOPOSD) $(if $(BACKEND_SRC),$(LIB_BACKENDS))
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $< -o $@ $(LIB_CLIENT) $(ENGINE_LINK) $(GRPC_LIBS) $(LDLIBS)
# The soak (issue 10): toposd under mixed and hostile load with periodic
# kill -9 for SOAK_SECONDS (default 600); not part of `make test`.
$(BUILD)/bench/soak: bench/soak.c $(LIB_CLIENT) $(LIB_A) $(TOPOSD) $(if $(BACKEND_SRC),$(LIB_BACKENDS))
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $< -o $@ $(LIB_CLIENT) $(ENGINE_LINK) $(GRPC_LIBS) $(LDLIBS)
soak: $(BUILD)/bench/soak $(TOPOSD)
	TOPOS_BUILD=$(BUILD) $(BUILD)/bench/soak
# gemm runs twice: as the issue defines it (OpenBLAS variables unset), and
# with OpenBLAS pinned to its SkylakeX kernels, because OpenBLAS 0.3.21
# does not recognise this CPU and otherwise runs generic kernels
# (docs/bench.md).
bench: $(BENCH_BIN)
	@for b in $(BENCH_BIN); do $$b || exit 1; done
	@echo "gemm again, OpenBLAS pinned to SkylakeX (--openblas-core SkylakeX):"
	@$(BUILD)/bench/gemm --openblas-core SkylakeX

# libFuzzer on the spec decoder, from a seed corpus of real encoded specs.
FUZZ_SECONDS ?= 60
FUZZ_DIR := build/fuzz
fuzz:
	@mkdir -p $(FUZZ_DIR)/corpus
	clang -std=c17 -g -O1 -D_GNU_SOURCE -Iengine $(CJSON_CFLAGS) -ffp-contract=off \
	  -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
	  tests/fuzz/fuzz_decode.c $(ENGINE_SRC) \
	  -o $(FUZZ_DIR)/fuzz_decode -lcjson -lcrypto -lm -pthread
	clang -std=c17 -g -O1 -D_GNU_SOURCE -Iengine $(CJSON_CFLAGS) -ffp-contract=off \
	  tests/fuzz/make_corpus.c $(ENGINE_SRC) -o $(FUZZ_DIR)/make_corpus \
	  -lcjson -lcrypto -lm -pthread
	$(FUZZ_DIR)/make_corpus $(FUZZ_DIR)/corpus
	$(FUZZ_DIR)/fuzz_decode -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=2048 \
	  -max_len=65536 $(FUZZ_DIR)/corpus

C_FILES = $(wildcard engine/*.[ch] backends/*.[ch] store/*.[ch] proto/*.[ch] client/*.[ch] \
            server/*.[ch] tests/*.c tests/*/*.[ch] examples/*.c examples/*/*.c bench/*.c)

format:
	clang-format -i $(C_FILES)

lint:
	clang-format --dry-run -Werror $(C_FILES)
	cppcheck --quiet --inline-suppr --error-exitcode=1 --enable=warning --std=c11 \
	  -Iengine -Istore -Iproto -Iclient engine store proto client server

clean:
	rm -rf build
