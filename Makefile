# refit: `make demo` runs the demo, `make test` runs every test.
BUILD ?= build
ASAN_BUILD ?= build-asan
MESON_TEST_ARGS ?= --print-errorlogs

.PHONY: all demo test test-plain test-asan deps bench clean

all: deps $(BUILD)/build.ninja
	@ninja -C $(BUILD) --quiet

deps:
	@scripts/deps.sh $(BUILD)

$(BUILD)/build.ninja:
	@meson setup $(BUILD) -Dtests=true >/dev/null

$(ASAN_BUILD)/build.ninja:
	@CC=clang meson setup $(ASAN_BUILD) -Dtests=true -Db_sanitize=address,undefined \
	  -Db_lundef=false -Dbuildtype=debug -Dcuda=disabled >/dev/null

# The demo journals its updates; the table after it is what an operator reads.
DEMO_JOURNAL ?= $(BUILD)/demo-journal.db
demo: all
	@rm -f $(DEMO_JOURNAL) $(DEMO_JOURNAL)-wal $(DEMO_JOURNAL)-shm
	@REFIT_JOURNAL=$(DEMO_JOURNAL) $(BUILD)/tools/refit-demo
	@echo
	@echo "The journal ($(BUILD)/tools/refitctl journal updates --db $(DEMO_JOURNAL)):"
	@$(BUILD)/tools/refitctl journal updates --db $(DEMO_JOURNAL)

# Every test: the plain build, then the same suite under ASan+UBSan.
test: test-plain test-asan

test-plain: all
	@meson test -C $(BUILD) $(MESON_TEST_ARGS)

test-asan: deps $(ASAN_BUILD)/build.ninja
	@ninja -C $(ASAN_BUILD) --quiet
	@UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	  ASAN_OPTIONS=detect_leaks=1 \
	  REFIT_VENV=$(abspath $(BUILD))/venv \
	  meson test -C $(ASAN_BUILD) $(MESON_TEST_ARGS)

bench: all
	@$(BUILD)/tools/refit-bench host --json

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
