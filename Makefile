# refit: `make demo` runs the demo, `make test` runs every test.
BUILD ?= build
ASAN_BUILD ?= build-asan
MESON_TEST_ARGS ?= --print-errorlogs

.PHONY: all demo test test-plain test-asan deps bench clean

all: deps $(BUILD)/build.ninja
	@ninja -C $(BUILD) >/dev/null

deps:
	@scripts/deps.sh $(BUILD)

$(BUILD)/build.ninja:
	@meson setup $(BUILD) -Dtests=true >/dev/null

$(ASAN_BUILD)/build.ninja:
	@CC=clang meson setup $(ASAN_BUILD) -Dtests=true -Db_sanitize=address,undefined \
	  -Db_lundef=false -Dbuildtype=debug -Dcuda=disabled >/dev/null

demo: all
	@$(BUILD)/tools/refit-demo

# Every test: the plain build, then the same suite under ASan+UBSan.
test: test-plain test-asan

test-plain: all
	@meson test -C $(BUILD) $(MESON_TEST_ARGS)

test-asan: deps $(ASAN_BUILD)/build.ninja
	@ninja -C $(ASAN_BUILD) >/dev/null
	@UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	  ASAN_OPTIONS=detect_leaks=1 \
	  REFIT_VENV=$(abspath $(BUILD))/venv \
	  meson test -C $(ASAN_BUILD) $(MESON_TEST_ARGS)

bench: all
	@$(BUILD)/tools/refit-bench host --json

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
