# BML-INA. `make run` sets up and runs the demo; `make test` runs the tests.
PY := .venv/bin/python
TARGET ?= soft

.PHONY: setup build run test test-e2e test-bmv2 sim-soak bench bench-speed bench-schedules bench-claims bench-faults bench-sim bench-scale train lint docker-build docker-run docker-test clean

setup:
	@bash tools/setup.sh

build: setup
	@bash tools/build_p4.sh

run: setup
	$(PY) -m emulation.demo --target $(TARGET)

test: setup
	$(PY) -m pytest -q

test-e2e: setup
	$(PY) -m pytest -q tests/test_packets.py tests/test_emulation.py tests/test_host_e2e.py

test-bmv2: setup
	BMV2_SWITCH=$${BMV2_SWITCH:-/opt/bmv2/bin/simple_switch_grpc} $(PY) -m pytest -q tests/test_packets.py -k bmv2

bench: setup
	$(PY) -m pip install -q -e ".[torch]" || echo "bench: torch is not installable here; no gloo rows"
	$(PY) -m benchmarks.switch_pps
	$(PY) -m benchmarks.allreduce_gst
	$(PY) -m benchmarks.bcube_schedules
	$(PY) -m benchmarks.claims
	$(PY) -m benchmarks.faults
	$(PY) -m benchmarks.speed --bcube bcube:3,2

bench-speed: setup  # against gloo on fast links, per lane width (star:4, bcube:3,2; ~3 min)
	$(PY) -m pip install -q -e ".[torch]" || echo "bench-speed: torch is not installable here; no gloo rows"
	$(PY) -m benchmarks.speed --bcube bcube:3,2

bench-schedules: setup  # the three BCube schedules on all NICs of bcube:3,2 (~5 min)
	$(PY) -m benchmarks.bcube_schedules

bench-claims: setup  # every scheme on the same links against the cost model (~12-20 min)
	$(PY) -m pip install -q -e ".[torch]" || echo "bench-claims: torch is not installable here; no ring rows"
	$(PY) -m benchmarks.claims

bench-faults: setup  # loss goodput, and each fault's detection and recovery (star:4, ~5 min)
	$(PY) -m benchmarks.faults

bench-sim: setup  # the simulator against the emulation on the same 2 Mbit/s links (~9 min)
	$(PY) -m benchmarks.sim_validation

bench-scale: setup  # BCubes of 16 to 256 servers in virtual time, beside the model (~25 min)
	$(PY) -m benchmarks.scale

train: setup  # LeNet-5 through BML-INA and through gloo; e.g. ARGS='--topo bcube:3,2'
	$(PY) -m train $(ARGS)

sim-soak: setup  # 20,000 seeded fault trials of the real engine and pipeline in virtual time
	$(PY) -m simulation.cli soak --seeds $${SEEDS:-20000} --jobs $${JOBS:-0} --topos bcube:2,2,star:4,bcube:3,2,bcube:2,3,bcube:4,2,bcube:3,3

lint: setup
	$(PY) -m ruff check .

docker-build:
	docker compose run --rm p4c

docker-run:
	docker compose run --rm demo

docker-test:
	docker compose run --rm test

clean:
	-$(PY) -m emulation.net --name demo down
	rm -rf results .pytest_cache
