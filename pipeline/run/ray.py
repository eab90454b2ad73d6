"""The Ray executor: one actor per engine replica, units handed to replicas as they free up.

The stages are the same as the local executor's; Ray is imported only here. Each actor builds its own engine from the
`EngineSpec` (an engine that needs its own virtualenv runs in a worker process beside the actor, exactly as locally).
An actor that dies mid-unit (engine crash, OOM, kill -9) is restarted by Ray and the unit retried on it, up to
`runner.max_retries` times; a unit that keeps failing fails the run, which then writes no manifest.
With `runner.overlap_writes` each actor holds two units and writes one while its engine captures the other (a threaded
actor whose engine is used under a lock), as the local executor's `run_units` does.
CPU replicas compute with the driver's CPU threads (`CpuThreads`), not the one thread Ray gives an actor of
`runner.cpus_per_replica=1`: the same command gives the same tensors on either runner.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass
from functools import partial
from importlib.util import find_spec
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from pipeline.config import ConfigError, RunnerConfig
from pipeline.core.contracts import Capture, EngineInfo, PreparedSample
from pipeline.engines.base import Engine, EngineStartError, error_summary
from pipeline.engines.process.remote import EngineWorkerError
from pipeline.engines.registry import make_engine
from pipeline.run.contract import StagePlan
from pipeline.run.executor import Executor, OnDone

log = logging.getLogger(__name__)
# Without the first, Ray replaces 127.0.0.1 by the machine's routable address; nothing here may leave loopback.
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
FORWARDED_ENV = ("PIPELINE_MODELS_DIR", "SGLANG_USE_CPU_ENGINE", "VLLM_CPU_KVCACHE_SPACE")
OMP_ENV = "OMP_NUM_THREADS"
# A replica found unavailable (its node lost) gets no unit for this long; a unit whose replicas stay unavailable
# longer than Ray takes to declare a node dead and restart its actors elsewhere fails (the run is resumable).
PARK_SECONDS = 5.0
UNAVAILABLE_SECONDS = 300.0


@dataclass(frozen=True)
class CpuThreads:
    """The CPU threads a local run's engine computes with: torch's intra-op threads in the driver, and the driver's
    OMP_NUM_THREADS (or its absence) for the engine worker processes a replica starts. Ray sets OMP_NUM_THREADS to an
    actor's num_cpus (`runner.cpus_per_replica`, 1 by default), and bf16 CPU kernels reduce in another order on
    another thread count: an actor that kept Ray's count would write other bits than the same command run locally.
    Set OMP_NUM_THREADS where the job starts to choose the count for every runner."""

    torch_threads: int
    omp_env: str | None

    @classmethod
    def of_this_process(cls) -> "CpuThreads":
        return cls(torch_threads=torch.get_num_threads(), omp_env=os.environ.get(OMP_ENV))

    def apply(self) -> None:
        torch.set_num_threads(self.torch_threads)
        if self.omp_env is None:
            os.environ.pop(OMP_ENV, None)
        else:
            os.environ[OMP_ENV] = self.omp_env


def _with_threads(threads: CpuThreads | None, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`fn` in a Ray task, computing with the driver's threads (a CPU replica's resources)."""
    if threads is not None:
        threads.apply()
    return fn(*args, **kwargs)


class CaptureActor:
    """One engine replica. Wrapped by `ray.remote` at run time, so importing this module needs no Ray."""

    def __init__(self, name: str, make: Callable[[], Engine], threads: CpuThreads | None = None) -> None:
        if threads is not None:  # before the engine exists: it is made with the driver's threads
            threads.apply()
        self.engine = make()
        self._start_error: str | None = None
        try:
            self.engine.start()
        except Exception as e:  # kept as one line for the driver: Ray would only pass on the traceback's text
            log.error("engine %s did not start: %s", name, error_summary(e))
            log.debug("the engine's error in full", exc_info=True)
            self.engine.close()
            self._start_error = error_summary(e)
        self._engine_lock = threading.Lock()  # engines are not thread-safe; writing needs no engine

    def start_error(self) -> str | None:
        return self._start_error

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def info(self) -> EngineInfo:
        with self._engine_lock:
            return self.engine.info()

    def probe(self, samples: Sequence[PreparedSample]) -> list[Capture]:
        with self._engine_lock:
            return self.engine.capture(samples)

    def run_unit(self, settings: StagePlan, run_dir: str, index: int, samples: Sequence[Any]) -> Any:
        if self._start_error:  # a replacement actor whose engine did not start: the unit fails with why
            raise RuntimeError(f"engine did not start: {self._start_error}")
        stage = settings.stage(self.engine)
        try:
            with self._engine_lock:
                captures = stage.compute(samples)
        except EngineWorkerError:
            # The engine process is gone: end this actor so Ray restarts it (a fresh engine) and retries its units.
            log.exception("engine died during unit %d; restarting the actor", index)
            os._exit(1)
        return stage.publish(Path(run_dir), stage.write(Path(run_dir), index, samples, captures))


class RayExecutor(Executor):
    def __init__(self, cfg: RunnerConfig, **kwargs: Any) -> None:
        if find_spec("ray") is None:  # at construction: before the gate and any engine start
            raise ConfigError("runner=ray needs Ray in this environment: pip install -e '.[ray]' "
                              "(scripts/setup.sh installs it)")
        super().__init__(**kwargs)
        self.cfg = cfg
        self.actors: list[Any] = []
        self._started_ray = False
        self._units_per_actor = 2 if cfg.overlap_writes else 1  # overlapped: one capturing, one being written
        # A CPU replica computes as the driver would; on GPUs the CPU threads do not change the bits, and a GPU node's
        # cores are not the driver's.
        self.threads = CpuThreads.of_this_process() if cfg.gpus_per_replica == 0 else None

    def _init_ray(self):
        for key, value in LOOPBACK_ENV.items():
            os.environ.setdefault(key, value)
        import ray

        if not ray.is_initialized():
            env = {k: os.environ[k] for k in FORWARDED_ENV if k in os.environ}
            kwargs: dict[str, Any] = {"runtime_env": {"env_vars": env}, "log_to_driver": True}
            if self.cfg.address is None:  # a local cluster, loopback only
                kwargs.update(_node_ip_address="127.0.0.1", include_dashboard=False)
            ray.init(address=self.cfg.address, **kwargs)
            self._started_ray = True
        return ray

    def __enter__(self) -> "RayExecutor":
        ray = self._init_ray()
        actor_cls = ray.remote(CaptureActor).options(
            num_cpus=self.cfg.cpus_per_replica, num_gpus=self.cfg.gpus_per_replica,
            max_restarts=self.cfg.max_retries, max_task_retries=self.cfg.max_retries,
            max_concurrency=self._units_per_actor)
        # What an actor builds its replica from (picklable; the executor itself holds Ray handles).
        make = partial(make_engine, self.spec, model_path=self.model_path, points=self.points,
                       num_layers=self.num_layers, trust_remote_code=self.trust_remote_code,
                       max_seq_len=self.max_seq_len, task=self.task)
        self.actors = [actor_cls.remote(self.spec.name, make, self.threads) for _ in range(self.cfg.num_replicas)]
        errors = [e for e in ray.get([a.start_error.remote() for a in self.actors]) if e]
        if errors:
            self.__exit__()
            raise EngineStartError(f"engine={self.spec.name} did not start on Ray: {errors[0]}")
        infos = ray.get([a.info.remote() for a in self.actors])
        self._info = _same_everywhere(infos)
        return self

    def __exit__(self, *exc: object) -> None:
        import ray

        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        self.actors = []
        if self._started_ray:
            ray.shutdown()

    def run_beside(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run `fn` as a Ray task with a replica's resources (a GPU cluster's driver may have no GPU); usable before
        the replicas start, so the gate's reference engines free their devices before the primary takes them."""
        ray = self._init_ray()
        task = ray.remote(_with_threads).options(num_cpus=self.cfg.cpus_per_replica,
                                                 num_gpus=self.cfg.gpus_per_replica, max_retries=0)
        return ray.get(task.remote(self.threads, fn, *args, **kwargs))

    def info(self) -> EngineInfo:
        return self._info

    def capture(self, samples: Sequence[PreparedSample]) -> list[Capture]:
        import ray

        return ray.get(self.actors[0].probe.remote(list(samples)))

    def _run_units(self, settings: StagePlan, run_dir: Path, units: Sequence[Sequence[Any]],
                   todo_list: list[int], done: OnDone) -> dict[int, str]:
        import ray

        nodes = dict(zip(self.actors, ray.get([a.node_id.remote() for a in self.actors])))
        queue = _Queue(lambda actor, index: actor.run_unit.remote(settings, str(run_dir), index, list(units[index])),
                       todo_list)
        for _ in range(self._units_per_actor):
            for actor in self.actors:
                queue.submit(actor)
        while queue.inflight or (queue.todo and queue.parked):
            queue.unpark()
            if not queue.inflight:  # every replica with units to run is parked: wait for one
                time.sleep(PARK_SECONDS)
                continue
            ready, _ = ray.wait(list(queue.inflight), num_returns=1, timeout=PARK_SECONDS)
            if not ready:
                continue
            actor, index = queue.inflight.pop(ready[0])
            try:
                result = ray.get(ready[0])
            except ray.exceptions.ActorUnavailableError as e:
                queue.unavailable(actor, index, e)
                continue
            except ray.exceptions.RayError as e:  # Ray's own retries on restarted actors are spent
                queue.failures[index] = _one_line(e)
                log.error("unit %d failed after %d retries: %s", index, self.cfg.max_retries, queue.failures[index])
                if isinstance(e, ray.exceptions.RayActorError):
                    continue  # that replica is gone for good: hand its share to the others
            else:
                queue.per_node[nodes[actor]] += 1
                done(result)
            queue.submit(actor)
        return queue.finish()


class _Queue:
    """The units of one `_run_units` call: those waiting, those in flight on a replica, the replicas parked after
    they were found unavailable, the units that failed and how many finished on each node."""

    def __init__(self, send: Callable[[Any, int], Any], todo: list[int]) -> None:
        self.send, self.todo = send, deque(todo)
        self.inflight: dict[Any, tuple[Any, int]] = {}  # Ray's reference -> (replica, unit)
        self.failures: dict[int, str] = {}
        self.per_node: Counter[str] = Counter()  # units finished per node (the one each replica started on)
        self.parked: dict[Any, float] = {}  # a replica found unavailable -> when to send it a unit again
        self._unavailable_since: dict[int, float] = {}  # per unit: when its replica was first found unavailable

    def submit(self, actor: Any) -> None:
        if self.todo:
            index = self.todo.popleft()
            self.inflight[self.send(actor, index)] = (actor, index)

    def unpark(self) -> None:
        for actor in [a for a, when in self.parked.items() if when <= time.monotonic()]:
            del self.parked[actor]
            self.submit(actor)

    def unavailable(self, actor: Any, index: int, e: Exception) -> None:
        """The replica's node went away (or it is restarting) and Ray has not yet declared it dead, which takes a
        while: the unit goes back to the queue for any replica (a redone unit replaces what was published of it), and
        this replica is sent units again once Ray had time to restart it elsewhere."""
        first = self._unavailable_since.setdefault(index, time.monotonic())
        if time.monotonic() - first > UNAVAILABLE_SECONDS:
            self.failures[index] = _one_line(e)
            log.error("unit %d failed: its replicas were unavailable for %.0fs", index, UNAVAILABLE_SECONDS)
            return
        log.warning("unit %d: its replica is unavailable (a node lost?); running it again", index)
        self.todo.appendleft(index)
        self.parked[actor] = time.monotonic() + PARK_SECONDS

    def finish(self) -> dict[int, str]:
        for index in self.todo:  # every replica died
            self.failures[index] = "no live engine replica left"
        log.info("units per Ray node: %s", ", ".join(f"{node[:12]}: {n}" for node, n in sorted(self.per_node.items())))
        return self.failures


def _one_line(e: Exception) -> str:
    return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"


def _same_everywhere(infos: list[EngineInfo]) -> EngineInfo:
    """Every replica must report the same engine; a mixed cluster would make one run's shards disagree."""
    first = infos[0]
    for i, info in enumerate(infos[1:], start=1):
        if info != first:
            raise RuntimeError(f"engine replica {i} reports {info} but replica 0 reports {first}")
    return first
