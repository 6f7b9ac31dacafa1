# refit: `make demo` runs the demo, `make test` runs every test.
# MESON_ARGS go to `meson setup` (and `meson configure` of an existing
# build folder), e.g. make test MESON_ARGS=-Dcuda=disabled.
BUILD ?= build
ASAN_BUILD ?= build-asan
MESON_ARGS ?=
MESON_TEST_ARGS ?= --print-errorlogs

.PHONY: all demo test test-plain test-asan deps setup setup-asan bench clean

all: setup
	@ninja -C $(BUILD) --quiet

deps:
	@scripts/deps.sh $(BUILD)

# A new folder is set up with MESON_ARGS; an existing one takes them too.
setup: deps
	@if [ -f $(BUILD)/build.ninja ]; then \
	  [ -z "$(MESON_ARGS)" ] || meson configure $(BUILD) $(MESON_ARGS); \
	else \
	  meson setup $(BUILD) -Dtests=true $(MESON_ARGS) >/dev/null; \
	fi

setup-asan: deps
	@if [ -f $(ASAN_BUILD)/build.ninja ]; then \
	  [ -z "$(MESON_ARGS)" ] || meson configure $(ASAN_BUILD) $(MESON_ARGS); \
	else \
	  CC=clang meson setup $(ASAN_BUILD) -Dtests=true -Db_sanitize=address,undefined \
	    -Db_lundef=false -Dbuildtype=debug -Dcuda=disabled $(MESON_ARGS) >/dev/null; \
	fi

# The demo journals its updates; the table after it is what an operator reads.
# Only the demo's targets are built (the `demo` alias, tools/meson.build).
DEMO_JOURNAL ?= $(BUILD)/demo-journal.db
demo: setup
	@ninja -C $(BUILD) --quiet demo
	@rm -f $(DEMO_JOURNAL) $(DEMO_JOURNAL)-wal $(DEMO_JOURNAL)-shm
	@REFIT_JOURNAL=$(DEMO_JOURNAL) $(BUILD)/tools/refit-demo
	@echo
	@echo "The journal ($(BUILD)/tools/refitctl journal updates --db $(DEMO_JOURNAL)):"
	@$(BUILD)/tools/refitctl journal updates --db $(DEMO_JOURNAL)

# Every test: the plain build, then the same suite under ASan+UBSan.
test: test-plain test-asan

test-plain: all
	@meson test -C $(BUILD) $(MESON_TEST_ARGS)

test-asan: setup-asan
	@ninja -C $(ASAN_BUILD) --quiet
	@UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	  ASAN_OPTIONS=detect_leaks=1 \
	  REFIT_VENV=$(abspath $(BUILD))/venv \
	  meson test -C $(ASAN_BUILD) $(MESON_TEST_ARGS)

bench: all
	@$(BUILD)/tools/refit-bench host --json

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
