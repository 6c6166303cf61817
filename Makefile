# redlm - plain Makefile.
#   make            CPU-only build into build/
#   make CUDA=1     adds the CUDA backend (engine/cuda, nvcc + cuBLAS)
#   make test       builds and runs every test; ends with "N passed, N failed, N skipped"
#   make bench      runs the benchmarks (figures go to BENCHMARKS.md by hand)
#   make bench-fleet  the soak: Redis, 2 dispatchers, 64 sim H200 workers, faults (BENCHMARKS.md)
#   make bench-fleet-cluster  the same soak on one Redis, then on a local 3-master cluster
#   make bench-attacks  every attack on the queue contract at once: lost, gaps, mixed, wrong submitter, refused (all 0)
#   make bench-affinity  prefix-affine pulling: multi-turn conversations on 4 CPU workers, affinity off and on (BENCHMARKS.md)
#   make bench-overlap  step period at batch 64 behind 1 ms of added Redis latency, publish_overlap on and off
#   make gpu-bundle  the CUDA build, stripped with its libraries and the device script, for a GPU machine
#   make demo       the whole system on one machine: Redis, a CPU worker, the dispatcher, the chat page
#   make fuzz       builds the libFuzzer targets with clang
#   make asan       the same build with AddressSanitizer + UBSan, in build-asan/
#   make deps       installs the Debian packages the project needs (through sudo when not root)

CUDA    ?= 0
# The CUDA flavour builds into its own folder: its objects are compiled with
# -DREDLM_CUDA=1 (engine/backend.c registers the CUDA backend), and linking
# a CPU-built object into a CUDA binary gives a worker without the backend.
BUILD   ?= $(if $(filter 1,$(CUDA)),build-cuda,build)
CC      ?= cc
PREFIX  ?= /usr/local
DESTDIR ?=

# -std=c11 plus _GNU_SOURCE for mmap/pthread/clock extras; -MMD for header
# dependencies. No -ffast-math: results must be reproducible bit for bit.
# CFLAGS is the user's (optimisation, sanitizers); the flags the code needs
# live in ALL_CFLAGS so that `make CFLAGS=...` cannot drop them.
CFLAGS  ?= -O2 -g
ALL_CFLAGS = $(CFLAGS) -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter \
           -Wshadow -Wstrict-prototypes -fno-strict-aliasing -pthread -MMD -MP \
           -iquote . -iquote common -iquote engine
# -iquote, not -I: engine/sched.h must not hide the system <sched.h>
LDLIBS  += -lhiredis -lconfig -lcjson -lpcre2-8 -lutf8proc -lm -pthread

DEB_PKGS = build-essential clang pkg-config libhiredis-dev libcjson-dev \
           libconfig-dev libpcre2-dev libutf8proc-dev libmicrohttpd-dev \
           libsystemd-dev libcmocka-dev redis-server python3-pytest \
           python3-redis python3-jsonschema
# the example web backend's browser test: headless Chromium driven over the
# DevTools protocol from Python (tests/integration/test_web.py)
DEB_PKGS += chromium python3-websocket
# promtool (Debian's prometheus package) lints both daemons' /metrics in
# tests/integration (test_worker.py, test_http.py)
DEB_PKGS += prometheus
# redlm chat: line editing and history (libedit); its test drives a real
# terminal through tmux (test_cli.py)
DEB_PKGS += libedit-dev tmux
# the official `openai` npm client drives the front door
# (tests/integration/test_http*.py; make deps runs npm ci in tests/integration/node).
# Debian's npm is installed only where no npm command exists: NodeSource's
# nodejs package carries its own and conflicts with Debian's.
DEB_PKGS += nodejs
# Pydantic 1.10 writes part of the JSON Schema generator corpus
# (tests/data/schemas/generators/pydantic_schemas.py, checked by
# tests/integration/test_schema_generators.py; issue 29)
DEB_PKGS += python3-pydantic

COMMON_SRC := $(wildcard common/*.c)
ENGINE_SRC := $(wildcard engine/*.c engine/cpu/*.c engine/grammar/*.c engine/sim/*.c) $(wildcard engine/cuda/*.c) # engine/cuda/*.c: plain C (kv_fit), every build
CLI_SRC    := $(wildcard worker/cli/*.c)
WORKER_SRC := $(wildcard worker/*.c)
DISP_SRC   := $(wildcard dispatcher/*.c)
TEST_SRC   := $(wildcard tests/unit/test_*.c)
BENCH_SRC  := $(wildcard tests/bench/bench_*.c)
FUZZ_SRC   := $(wildcard tests/fuzz/fuzz_*.c)

ifeq ($(CUDA),1)
NVCC       ?= nvcc
CUDA_HOME  ?= /usr/local/cuda
CUDA_SRC   := $(wildcard engine/cuda/*.cu)
CUDA_OBJ   := $(CUDA_SRC:%.cu=$(BUILD)/%.o)
# sm_80 (A100) and sm_90 (H100/H200) machine code, plus PTX for newer parts.
NVFLAGS    ?= -O3 -g -lineinfo -std=c++17 -Xcompiler -fPIC \
              -gencode arch=compute_80,code=sm_80 \
              -gencode arch=compute_90,code=sm_90 \
              -gencode arch=compute_90,code=compute_90
ALL_CFLAGS += -DREDLM_CUDA=1 -I$(CUDA_HOME)/include
LDLIBS     += -L$(CUDA_HOME)/lib64 -lcublasLt -lcublas -lcudart -lstdc++
endif

# One build folder holds one flavour: `make CUDA=1 BUILD=build` over a CPU
# build would reuse objects compiled without -DREDLM_CUDA. The first build
# writes the flavour down; a later one of the other flavour stops here.
FLAVOUR := $(if $(filter 1,$(CUDA)),cuda,cpu)
ifeq ($(filter clean deps,$(MAKECMDGOALS)),)
OLD_FLAVOUR := $(shell cat $(BUILD)/.flavour 2>/dev/null)
ifneq ($(OLD_FLAVOUR),)
ifneq ($(OLD_FLAVOUR),$(FLAVOUR))
$(error $(BUILD)/ holds a $(OLD_FLAVOUR) build; this is a $(FLAVOUR) build: use another BUILD= or `make clean BUILD=$(BUILD)`)
endif
endif
$(shell mkdir -p $(BUILD) && echo $(FLAVOUR) > $(BUILD)/.flavour)
endif

COMMON_OBJ := $(COMMON_SRC:%.c=$(BUILD)/%.o)
ENGINE_OBJ := $(ENGINE_SRC:%.c=$(BUILD)/%.o) $(CUDA_OBJ)
CLI_OBJ    := $(CLI_SRC:%.c=$(BUILD)/%.o)
WORKER_OBJ := $(WORKER_SRC:%.c=$(BUILD)/%.o)
DISP_OBJ   := $(DISP_SRC:%.c=$(BUILD)/%.o)
BINS       := $(BUILD)/redlm $(if $(WORKER_SRC),$(BUILD)/redlm-worker) \
              $(if $(wildcard dispatcher/main.c),$(BUILD)/redlm-dispatcher)
# the daemons talk HTTP (metrics, front door) and to systemd
DAEMON_LIBS = -lmicrohttpd -lsystemd
TEST_BIN   := $(TEST_SRC:tests/unit/%.c=$(BUILD)/tests/%)
BENCH_BIN  := $(BENCH_SRC:tests/bench/%.c=$(BUILD)/tests/%)
LIBENGINE  := $(BUILD)/libredlm_engine.a
LIBCOMMON  := $(BUILD)/libredlm_common.a

# keep the objects of test and bench programs between builds (they are
# make's "intermediate" files otherwise, deleted and rebuilt every time);
# named one by one: a bare .SECONDARY: would also stop a deleted object
# from being rebuilt
.SECONDARY: $(TEST_SRC:%.c=$(BUILD)/%.o) $(BENCH_SRC:%.c=$(BUILD)/%.o) \
            $(patsubst %.c,$(BUILD)/%.o,$(wildcard tests/backend/test_*.c))

.PHONY: all test bench bench-fleet bench-fleet-cluster bench-attacks bench-affinity bench-overlap bench-responses bench-lora-fleet bench-lora-stall bench-quant-formats demo gpu-bundle fuzz asan deps clean install
all: $(BINS) $(TEST_BIN) $(BENCH_BIN)

ifeq ($(CUDA),1)
# GPU op tests: built only with CUDA=1; each skips (exit 0) without a device
BACKEND_TEST_BIN := $(patsubst tests/backend/%.c,$(BUILD)/tests/%,$(wildcard tests/backend/test_*.c))
all: $(BACKEND_TEST_BIN)
$(BUILD)/tests/test_backend_%: $(BUILD)/tests/backend/test_backend_%.o $(LIBENGINE) $(LIBCOMMON)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(LDFLAGS) -o $@ $< $(LIBENGINE) $(LIBCOMMON) $(LDLIBS) -lcmocka
endif

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -c $< -o $@

# -MMD -MP as for C: a .cu object depends on every header it includes
# (engine/model.h, engine/cuda/ops.cuh), so C and CUDA objects never disagree
# on a struct's layout.
$(BUILD)/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -MMD -MP -MF $(@:.o=.d) -Xcompiler "-iquote . -iquote common -iquote engine" -c $< -o $@

$(LIBCOMMON): $(COMMON_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && $(AR) rcs $@ $^

$(LIBENGINE): $(ENGINE_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && $(AR) rcs $@ $^

# redlm chat edits lines with Debian's libedit (BSD licence, histedit.h)
$(BUILD)/redlm: $(CLI_OBJ) $(LIBENGINE) $(LIBCOMMON)
	$(CC) $(ALL_CFLAGS) $(LDFLAGS) -o $@ $(CLI_OBJ) $(LIBENGINE) $(LIBCOMMON) $(LDLIBS) -ledit

$(BUILD)/redlm-worker: $(WORKER_OBJ) $(LIBENGINE) $(LIBCOMMON)
	$(CC) $(ALL_CFLAGS) $(LDFLAGS) -o $@ $(WORKER_OBJ) $(LIBENGINE) $(LIBCOMMON) $(LDLIBS) $(DAEMON_LIBS)

$(BUILD)/redlm-dispatcher: $(DISP_OBJ) $(LIBENGINE) $(LIBCOMMON)
	$(CC) $(ALL_CFLAGS) $(LDFLAGS) -o $@ $(DISP_OBJ) $(LIBENGINE) $(LIBCOMMON) $(LDLIBS) $(DAEMON_LIBS)

$(BUILD)/tests/test_%: $(BUILD)/tests/unit/test_%.o $(LIBENGINE) $(LIBCOMMON)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(LDFLAGS) -o $@ $< $(LIBENGINE) $(LIBCOMMON) $(LDLIBS) -lcmocka

$(BUILD)/tests/bench_%: $(BUILD)/tests/bench/bench_%.o $(LIBENGINE) $(LIBCOMMON)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(LDFLAGS) -o $@ $< $(LIBENGINE) $(LIBCOMMON) $(LDLIBS)

test: all
	BUILD=$(BUILD) bash tests/run_tests.sh

bench: all
	BUILD=$(BUILD) bash tests/bench/run.sh

# The fleet soak (tests/bench/bench_fleet.py): Redis, 2 dispatchers, N sim
# workers, open-loop rates, faults; FLEET_ARGS overrides its bounds.
bench-fleet: all
	BUILD=$(BUILD) /usr/bin/python3 tests/bench/bench_fleet.py $(FLEET_ARGS)

# The same soak on one redis-server and then on a local 3-master + 3-replica
# cluster, in one run (--against-single): the cluster/single saturation ratio.
bench-fleet-cluster: all
	BUILD=$(BUILD) /usr/bin/python3 tests/bench/bench_fleet.py --cluster --against-single $(FLEET_ARGS)

# Prefix-affine pulling (issue 27; tests/bench/bench_affinity.py): multi-turn
# conversations on 4 CPU workers, one worker / affinity off / on, and a
# trace with no reuse; AFFINITY_ARGS overrides its sizes.
bench-affinity: all
	BUILD=$(BUILD) /usr/bin/python3 tests/bench/bench_affinity.py $(AFFINITY_ARGS)

# Every attack on the queue contract in one go (issue 26; tests/bench/attacks.py
# and the tests/bench/attack_*.py beside it): jobs lost, gaps, mixed streams,
# answers to the wrong submitter, honest requests refused; each must be 0.
bench-attacks: all
	BUILD=$(BUILD) /usr/bin/python3 tests/bench/attacks.py $(ATTACK_ARGS)

# Publishing off the critical path (issue 27 point 5): a sim worker's step period at
# batch 64, direct and behind 1 ms of added latency, publish_overlap on and off.
bench-overlap: all
	/usr/bin/python3 tests/bench/bench_overlap.py --build $(BUILD) $(OVERLAP_ARGS)

# Stored responses (tests/bench/bench_responses_store.py): store on vs off, and a
# conversation chained by previous_response_id vs sent whole, alternating.
bench-responses: all
	/usr/bin/python3 tests/bench/bench_responses_store.py $(RESPONSES_ARGS)

# Workers carrying different LoRA adapters (tests/bench/bench_lora_fleet.py): every
# worker holding the adapter, one of four (its own stream), the same on the binaries
# of LORA_ARGS="--before DIR", and jobs handed on from the pools.
bench-lora-fleet: all
	BUILD=$(BUILD) /usr/bin/python3 tests/bench/bench_lora_fleet.py $(LORA_ARGS)

bench-lora-stall: all
	BUILD=$(BUILD) /usr/bin/python3 tests/bench/bench_lora_stall.py $(STALL_ARGS)

# Every GGUF block format (tests/bench/quant_formats.sh): the 0.6B shape in each of
# llama.cpp's mixes, redlm's decode and prefill beside llama.cpp's on the same file
# (node-llama-cpp, pinned in tests/bench/llama) where node is installed.
bench-quant-formats: all
	BUILD=$(BUILD) bash tests/bench/quant_formats.sh

demo: all
	BUILD=$(BUILD) bash examples/demo.sh

# The folder a GPU machine runs (tests/gpu/bundle.sh): the CUDA flavour built
# here, stripped, with its libraries, redis-server, the fleet soak for the
# machine's CPUs and the device script; on the GPU machine:
# bash gpu-bundle/gpu_check.sh. Its own build folder: machine code for sm_90
# (H100/H200) alone keeps five programs' kernels inside the bundle's 48 MB.
GPU_BIN := redlm redlm-worker redlm-dispatcher tests/test_backend_ops tests/bench_cuda
GPU_NVFLAGS := -O3 -std=c++17 -Xcompiler -fPIC -gencode arch=compute_90,code=sm_90
gpu-bundle:
	$(MAKE) CUDA=1 BUILD=build-gpu NVFLAGS="$(GPU_NVFLAGS)" $(addprefix build-gpu/,$(GPU_BIN))
	BUILD=build-gpu bash tests/gpu/bundle.sh

# libFuzzer targets: each links the whole engine with the fuzzer runtime.
fuzz:
	$(MAKE) BUILD=build-fuzz CC=clang \
	  CFLAGS="-O1 -g -fsanitize=fuzzer-no-link,address,undefined" build-fuzz/libredlm_engine.a build-fuzz/libredlm_common.a
	@mkdir -p build-fuzz/fuzz
	for f in $(FUZZ_SRC); do \
	  n=$$(basename $$f .c); \
	  clang -O1 -g -std=c11 -D_GNU_SOURCE -iquote . -iquote common -iquote engine -fsanitize=fuzzer,address,undefined \
	    $$f $(FUZZ_EXTRA_SRC) build-fuzz/libredlm_engine.a build-fuzz/libredlm_common.a $(LDLIBS) -o build-fuzz/fuzz/$$n || exit 1; \
	done

asan:
	$(MAKE) BUILD=build-asan CFLAGS="-O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer" \
	  LDFLAGS="-fsanitize=address,undefined" test

# root installs directly (a container or CI has no sudo); anyone else
# through sudo, so the README's first command is the same for both
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
deps:
	@missing=""; for p in $(DEB_PKGS); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	else echo "all Debian packages present"; fi
	@command -v npm >/dev/null || $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq npm
	@# the official openai npm client, pinned by tests/integration/node/package-lock.json
	@# (integrity checksums): npm ci installs exactly that tree, never a newer one
	cd tests/integration/node && npm ci --no-audit --no-fund --loglevel=error
	@# the third-party clients (AI SDK, LangChain, the Agents SDK; zod 4), pinned
	@# by tests/integration/node-clients/package-lock.json (test_clients.py)
	cd tests/integration/node-clients && npm ci --no-audit --no-fund --loglevel=error

clean:
	rm -rf $(BUILD) build-asan build-fuzz

# ---- make install / make uninstall (systemd units, config, schemas) ----
#   make install [PREFIX=/usr/local] [DESTDIR=] [SYSCONFDIR=/etc]
#                [SYSTEMD_UNITDIR=$(PREFIX)/lib/systemd/system]
# Binaries to $(BINDIR), units (with @BINDIR@/@SYSCONFDIR@ filled in) to
# $(SYSTEMD_UNITDIR), the redlm user to $(SYSUSERSDIR), schemas and the
# sample Redis ACL file to $(DATADIR)/redlm, and the config files to
# $(SYSCONFDIR)/redlm only when they are absent: an edited config is never
# overwritten. Then, on the target: systemd-sysusers; systemctl
# daemon-reload. The restart back-off drop-in needs systemd >= 254
# (RestartSteps=); SYSTEMD_VERSION says which systemd the target runs and
# defaults to this machine's.
.PHONY: uninstall
BINDIR          ?= $(PREFIX)/bin
DATADIR         ?= $(PREFIX)/share
SYSCONFDIR      ?= /etc
SYSTEMD_UNITDIR ?= $(PREFIX)/lib/systemd/system
SYSUSERSDIR     ?= $(PREFIX)/lib/sysusers.d
SYSTEMD_VERSION ?= $(shell systemctl --version 2>/dev/null | awk 'NR == 1 {print $$2 + 0}')
UNITS      := redlm-worker@.service $(if $(DISP_SRC),redlm-dispatcher.service)
UNIT_SED    = sed -e 's|@BINDIR@|$(BINDIR)|g' -e 's|@SYSCONFDIR@|$(SYSCONFDIR)|g'
SCHEMA_FILES := $(wildcard schemas/*.json schemas/*.md)
SCHEMA_EXAMPLES := $(wildcard schemas/examples/*.json)

install: $(BINS)
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(SYSTEMD_UNITDIR) $(DESTDIR)$(SYSUSERSDIR) \
	  $(DESTDIR)$(DATADIR)/redlm/schemas/examples $(DESTDIR)$(SYSCONFDIR)/redlm
	install -m 755 $(BINS) $(DESTDIR)$(BINDIR)/
	for u in $(UNITS); do \
	  $(UNIT_SED) systemd/$$u.in > $(DESTDIR)$(SYSTEMD_UNITDIR)/$$u && \
	  chmod 644 $(DESTDIR)$(SYSTEMD_UNITDIR)/$$u || exit 1; \
	  if [ "$(SYSTEMD_VERSION)" -ge 254 ] 2>/dev/null; then \
	    install -d $(DESTDIR)$(SYSTEMD_UNITDIR)/$$u.d && \
	    install -m 644 systemd/restart-backoff.conf $(DESTDIR)$(SYSTEMD_UNITDIR)/$$u.d/ || exit 1; \
	  fi; \
	done
	install -m 644 systemd/redlm.target $(DESTDIR)$(SYSTEMD_UNITDIR)/
	install -m 644 systemd/redlm.sysusers $(DESTDIR)$(SYSUSERSDIR)/redlm.conf
	install -m 644 $(SCHEMA_FILES) $(DESTDIR)$(DATADIR)/redlm/schemas/
	install -m 644 $(SCHEMA_EXAMPLES) $(DESTDIR)$(DATADIR)/redlm/schemas/examples/
	install -m 644 config/redis-acl.conf config/redlm.conf $(DESTDIR)$(DATADIR)/redlm/
	install -d $(DESTDIR)$(DATADIR)/redlm/tokenizers/qwen3
	install -m 644 engine/tokenizers/qwen3/* $(DESTDIR)$(DATADIR)/redlm/tokenizers/qwen3/
	grep -v '^#' config/redis-acl.conf > $(DESTDIR)$(DATADIR)/redlm/redis-users.acl
	chmod 644 $(DESTDIR)$(DATADIR)/redlm/redis-users.acl
	for f in redlm.conf redlm.env; do \
	  [ -e $(DESTDIR)$(SYSCONFDIR)/redlm/$$f ] || \
	    install -m 644 config/$$f $(DESTDIR)$(SYSCONFDIR)/redlm/$$f || exit 1; \
	done

# Removes what install put there; a config file goes only if it is still
# the shipped one, so local settings (and passwords) stay.
uninstall:
	rm -f $(addprefix $(DESTDIR)$(BINDIR)/,redlm redlm-worker redlm-dispatcher)
	for u in redlm-worker@.service redlm-dispatcher.service; do \
	  rm -f $(DESTDIR)$(SYSTEMD_UNITDIR)/$$u $(DESTDIR)$(SYSTEMD_UNITDIR)/$$u.d/restart-backoff.conf; \
	  rmdir $(DESTDIR)$(SYSTEMD_UNITDIR)/$$u.d 2>/dev/null || true; \
	done
	rm -f $(DESTDIR)$(SYSTEMD_UNITDIR)/redlm.target $(DESTDIR)$(SYSUSERSDIR)/redlm.conf
	rm -rf $(DESTDIR)$(DATADIR)/redlm
	for f in redlm.conf redlm.env; do \
	  cmp -s config/$$f $(DESTDIR)$(SYSCONFDIR)/redlm/$$f && rm -f $(DESTDIR)$(SYSCONFDIR)/redlm/$$f; \
	done; rmdir $(DESTDIR)$(SYSCONFDIR)/redlm 2>/dev/null || true

# ---- redlm bench (worker/cli/cmd_loadbench.c) ----
# its plots are drawn by gnuplot; its statistics (worker/cli/loadstats.c)
# live with the CLI, so their unit test links that object too
DEB_PKGS += gnuplot-nox
$(BUILD)/tests/test_loadstats: $(BUILD)/tests/unit/test_loadstats.o $(BUILD)/worker/cli/loadstats.o $(LIBENGINE) $(LIBCOMMON)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(LDFLAGS) -o $@ $^ $(LDLIBS) -lcmocka

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)

# --- dispatcher (branch disp) ---------------------------------------------
# test_route checks the dispatcher's routing policy, which lives in
# dispatcher/route.c rather than a library: link that one object in.
$(BUILD)/tests/test_route: $(BUILD)/tests/unit/test_route.o $(BUILD)/dispatcher/route.o $(LIBENGINE) $(LIBCOMMON)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(LDFLAGS) -o $@ $(filter %.o,$^) $(LIBENGINE) $(LIBCOMMON) $(LDLIBS) -lcmocka
# test_dmetrics renders the dispatcher's /metrics text and heartbeat from
# dispatcher/metrics.c alone.
$(BUILD)/tests/test_dmetrics: $(BUILD)/tests/unit/test_dmetrics.o $(BUILD)/dispatcher/metrics.o $(LIBENGINE) $(LIBCOMMON)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(LDFLAGS) -o $@ $(filter %.o,$^) $(LIBENGINE) $(LIBCOMMON) $(LDLIBS) -lcmocka

# --- HTTP front door (branch http) ------------------------------------------
# The front door's code lives in dispatcher/, not in a library: its unit
# test, benchmark and fuzz target link the objects they need. The fuzz
# targets are compiled by clang in one loop above; FUZZ_EXTRA_SRC is
# compiled into each (the others never call it).
FUZZ_EXTRA_SRC := dispatcher/openai.c dispatcher/compat.c dispatcher/rstore.c dispatcher/pager.c dispatcher/convo.c dispatcher/anthropic.c dispatcher/embed.c dispatcher/rerank.c dispatcher/route.c
$(BUILD)/tests/test_openai: $(BUILD)/tests/unit/test_openai.o $(BUILD)/dispatcher/openai.o $(BUILD)/dispatcher/route.o $(LIBENGINE) $(LIBCOMMON)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(LDFLAGS) -o $@ $(filter %.o,$^) $(LIBENGINE) $(LIBCOMMON) $(LDLIBS) -lcmocka
# issue 29: the Responses API, Ollama's API and the vLLM-named metrics
$(BUILD)/tests/test_compat: $(BUILD)/tests/unit/test_compat.o $(BUILD)/dispatcher/compat.o $(BUILD)/dispatcher/rstore.o $(BUILD)/dispatcher/pager.o $(BUILD)/dispatcher/convo.o $(BUILD)/dispatcher/anthropic.o $(BUILD)/dispatcher/vmetrics.o $(BUILD)/dispatcher/fleet.o $(BUILD)/dispatcher/openai.o $(BUILD)/dispatcher/route.o $(LIBENGINE) $(LIBCOMMON)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(LDFLAGS) -o $@ $(filter %.o,$^) $(LIBENGINE) $(LIBCOMMON) $(LDLIBS) -lcmocka
# the embedding endpoints (POST /v1/embeddings, /api/embed, /api/embeddings)
$(BUILD)/tests/test_embed: $(BUILD)/tests/unit/test_embed.o $(BUILD)/dispatcher/embed.o $(BUILD)/dispatcher/openai.o $(BUILD)/dispatcher/route.o $(LIBENGINE) $(LIBCOMMON)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(LDFLAGS) -o $@ $(filter %.o,$^) $(LIBENGINE) $(LIBCOMMON) $(LDLIBS) -lcmocka
# the rerank and score endpoints (POST /v1/rerank, /v1/score and their aliases)
$(BUILD)/tests/test_rerank: $(BUILD)/tests/unit/test_rerank.o $(BUILD)/dispatcher/rerank.o $(BUILD)/dispatcher/openai.o $(BUILD)/dispatcher/route.o $(LIBENGINE) $(LIBCOMMON)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(LDFLAGS) -o $@ $(filter %.o,$^) $(LIBENGINE) $(LIBCOMMON) $(LDLIBS) -lcmocka
$(BUILD)/tests/bench_http: $(BUILD)/tests/bench/bench_http.o $(BUILD)/dispatcher/http.o $(BUILD)/dispatcher/openai.o $(BUILD)/dispatcher/compat.o $(BUILD)/dispatcher/rstore.o $(BUILD)/dispatcher/pager.o $(BUILD)/dispatcher/convo.o $(BUILD)/dispatcher/anthropic.o $(BUILD)/dispatcher/embed.o $(BUILD)/dispatcher/rerank.o $(BUILD)/dispatcher/vmetrics.o $(BUILD)/dispatcher/route.o $(LIBENGINE) $(LIBCOMMON)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(LDFLAGS) -o $@ $(filter %.o,$^) $(LIBENGINE) $(LIBCOMMON) $(LDLIBS) $(DAEMON_LIBS)
