"""The entry's data path (scripts/trainbench/pytorch/data.py): the DataLoader's switches, the loader rebuilt with
them drawing the same samples in the same order, the candidate's stream kept across openings (its workers too),
epochs started outside a slice's clock and counted, the step's time split into its parts, and loader workers that
fail (cannot be pickled, raise in __getitem__) each failing their candidate with the worker's reason.

A worker that hangs, and stops of autotune (SIGTERM, kill -9) with loader workers running, leave nothing behind:
the autotune tests at the end. Without torch these tests skip."""

import json
import os
import signal
import subprocess
import time
import uuid

import pytest

from conftest import REPO, built_tool

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402 - after the skip
from trainbench.pytorch import data as td  # noqa: E402
from trainbench.pytorch import entry as te  # noqa: E402

ENTRIES = os.path.join(REPO, "tests", "scripts", "entries")
FAULTY = os.path.join(ENTRIES, "faulty_loader.py")
EXAMPLE = os.path.join(REPO, "tuner", "entries", "my_train.py")
AUGMENTED = os.path.join(REPO, "tuner", "entries", "augmented_images.py")


def loader(workers=0, shuffle=True, **kw):
    g = torch.Generator().manual_seed(3)
    dataset = TensorDataset(torch.arange(64).float().unsqueeze(1), torch.arange(64))
    return DataLoader(dataset, batch_size=8, shuffle=shuffle, drop_last=True, num_workers=workers, **kw), g


def samples(batches, epochs=2):
    out = []
    for _ in range(epochs):
        out.append([int(i) for _, y in batches for i in y])
    return out


@pytest.mark.python_only
def test_the_switches_offer_the_entrys_own_values_first_and_only_for_a_map_style_loader():
    own, _ = loader(workers=0)
    offered = td.data_switches(own, on_gpu=False, ranks=1)
    cores = td.cores_per_rank(1)
    assert offered["num_workers"][0] == "0" and "1" in offered["num_workers"]
    assert max(int(n) for n in offered["num_workers"]) == cores
    assert offered["prefetch_factor"] == ["2", "4"] and offered["persistent_workers"] == ["off", "on"]
    assert offered["cpu_threads"] == ["left", "all"] and "pin_memory" not in offered
    with_workers, _ = loader(workers=1, prefetch_factor=4, persistent_workers=True, pin_memory=True)
    offered = td.data_switches(with_workers, on_gpu=True, ranks=1)
    assert offered["num_workers"][0] == "1" and offered["prefetch_factor"][0] == "4"
    assert offered["persistent_workers"][0] == "on" and offered["pin_memory"] == ["on", "off"]
    assert "cpu_threads" not in offered
    assert td.data_switches([1, 2, 3], on_gpu=False, ranks=1) == {}
    assert td.cores_per_rank(2) == max(1, cores // 2)


@pytest.mark.python_only
def test_a_rebuilt_loader_draws_the_same_samples_in_the_same_order_whatever_its_workers():
    """The sampler (and its shuffle) is the entry's: every candidate sees the samples of the entry's own, in its order.
    From the second epoch on, persistent workers draw one seed fewer from the global generator (PyTorch's iterator is
    reset, not made anew), so their later epochs are shuffled otherwise, as in the user's own training."""
    own, _ = loader(workers=0)
    torch.manual_seed(5)
    expected = samples(own)
    for workers, persistent in ((0, False), (1, False), (2, True)):
        settings = {"num_workers": workers, "prefetch_factor": 4 if workers else None,
                    "persistent_workers": persistent, "pin_memory": False, "cpu_threads": 1}
        rebuilt = td.rebuilt_loader(own, settings)
        assert rebuilt.num_workers == workers and rebuilt.sampler is own.sampler
        assert rebuilt.drop_last and rebuilt.collate_fn is own.collate_fn
        torch.manual_seed(5)
        drawn = samples(rebuilt)
        assert drawn[0] == expected[0], f"workers={workers}"
        if not persistent:
            assert drawn == expected, f"workers={workers}"
        stream = td.DataStream(rebuilt, workers, 4)
        stream.close()


@pytest.mark.python_only
def test_an_epoch_starts_outside_the_clock_and_its_cost_is_spread_over_its_micro_batches():
    own, _ = loader(workers=0, shuffle=False)   # 8 micro-batches an epoch
    stream = td.DataStream(own)
    stream.prepare(3)
    assert stream.first_start > 0 and len(stream.restarts) == 1 and stream.available() == 8
    stream.take(3)
    stream.stopped()
    stream.prepare(3)
    stream.take(3)          # 2 left: the next 3 would cross the epoch's end
    stream.prepare(3)
    assert len(stream.restarts) == 2 and stream.available() == 8
    mean = sum(stream.restarts) / 2
    assert stream.amortized_seconds(4) == pytest.approx(4 * mean / 8)
    assert stream.amortized_seconds(9) == 0.0, "an epoch shorter than the clock's micro-batches: measured inside it"
    stream.prepare(20)      # more than an epoch: no start outside the clock
    assert len(stream.restarts) == 2
    assert len(stream.take(20)) == 20


def process_state(pid):
    """The state letter of /proc/PID/stat: T where the process is stopped."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def settled_state(pid, wanted, seconds=2.0):
    """The process's state once it is `wanted` or `seconds` passed (a signal is delivered when it is next scheduled)."""
    deadline = time.monotonic() + seconds
    state = process_state(pid)
    while state != wanted and time.monotonic() < deadline:
        time.sleep(0.01)
        state = process_state(pid)
    return state


@pytest.mark.python_only
def test_the_loaders_workers_stand_still_between_clocks_and_go_on_where_they_were():
    """Between two clocks the workers are stopped, so that a candidate's slices add up to one run of its steps: the
    batches they made stay theirs to hand out, in order, and a stopped stream still ends its workers."""
    own, _ = loader(workers=2, shuffle=False, prefetch_factor=2)
    stream = td.DataStream(own, workers=2, prefetch_factor=2)
    pids = []
    try:
        stream.prepare(1)
        pids = stream.worker_pids()
        assert len(pids) == 2
        first = stream.take(1)[0][1].tolist()
        stream.stopped()
        assert [settled_state(pid, "T") for pid in pids] == ["T", "T"]
        time.sleep(0.3)
        stream.prepare(3)
        assert all(settled_state(pid, "S") != "T" for pid in pids)
        assert [b[1].tolist()[0] for b in stream.take(3)] == [first[0] + 8 * k for k in (1, 2, 3)]
        stream.stopped()
        assert stream.take(1)[0][1].tolist()[0] == first[0] + 8 * 4, "a batch taken outside a clock thaws them"
        assert not stream.frozen
        stream.stopped()
    finally:
        stream.close()
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in pids), "a stopped stream's workers outlived its close"


def entry_worker(spec):
    from trainbench.pytorch.worker import Worker
    return Worker({"kind": "entry", "entry": spec, "backend": "cpu"})


def loader_worker_pids(stream):
    iterator = stream.iterator
    return sorted(w.pid for w in getattr(iterator, "_workers", []))


@pytest.mark.python_only
def test_a_candidates_loader_workers_stay_across_its_openings_and_its_step_splits_into_parts():
    w = entry_worker(f"{EXAMPLE}:build")
    try:
        candidate = {"global_batch": 64, "micro_batch": 32, "switches": {"num_workers": "1", "persistent_workers": "on"}}
        said = w.open({"candidate": candidate})
        assert said["disposition"] == "passed" and said["checked"], said
        assert said["pipelined"], "its batches come from a worker process: autotune rates it by its mean step"
        stream = w.opened.stream
        pids = loader_worker_pids(stream)
        assert len(pids) == 1
        w.time_steps(2)
        assert settled_state(pids[0], "T") == "T", "the loader's worker stands still between clocks"
        w.close()
        said = w.open({"candidate": candidate})
        assert said["disposition"] == "passed" and not said["checked"]
        assert w.opened.stream is stream and loader_worker_pids(stream) == pids, "the same workers, still running"
        split = w.split_steps(3)
        parts = split["parts"]
        assert set(parts) == {"data", "forward_backward", "optimizer", "communication", "sync"}
        assert all(v >= 0 for v in parts.values()) and parts["forward_backward"] > 0
        assert sum(parts.values()) == pytest.approx(split["step_seconds"], rel=0.05)
        assert split["dataloader"] == {"num_workers": 1, "prefetch_factor": 2, "persistent_workers": True,
                                       "pin_memory": False, "cpu_threads": split["dataloader"]["cpu_threads"]}
        assert split["dataloader"]["cpu_threads"] == max(1, min(w.base_threads, td.cores_per_rank(1) - 1)) \
            or split["dataloader"]["cpu_threads"] == w.base_threads
        w.close()
        said = w.open({"candidate": {"global_batch": 64, "micro_batch": 32, "switches": {"num_workers": "0"}}})
        assert said["disposition"] == "passed" and said["pipelined"] is False, said
        w.close()
    finally:
        w.close_streams()
    assert all(not _alive(pid) for pid in pids), "the workers end with the worker's streams"


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.python_only
@pytest.mark.parametrize("name, switches, expected", [
    ("unpicklable", {"num_workers": "1"}, "cannot be handed to its worker processes"),
    ("build", {"num_workers": "1"}, "ValueError: sample"),
])
def test_a_dataset_that_fails_only_in_a_worker_fails_its_candidate_with_the_workers_reason(name, switches, expected):
    import multiprocessing
    start_method = multiprocessing.get_start_method()
    w = entry_worker(f"{FAULTY}:{name}")
    try:
        fine = w.open({"candidate": {"global_batch": 16, "micro_batch": 8, "switches": {"num_workers": "0"}}})
        assert fine["disposition"] == "passed", fine
        w.close()
        said = w.open({"candidate": {"global_batch": 16, "micro_batch": 8, "switches": switches}})
        assert said["disposition"] == "error" and expected in said["reason"], said
        assert "\n" not in said["reason"] and len(said["reason"]) < 600
        assert not any(json.loads(k)["switches"] == switches for k in w.streams), "a failed candidate's stream is dropped"
    finally:
        w.close_streams()
        multiprocessing.set_start_method(start_method, force=True)


@pytest.mark.python_only
def test_the_probe_offers_the_data_switches_with_when_they_apply():
    probed = te.probe_entry({"entry": f"{EXAMPLE}:build", "backend": "cpu", "micro_batch": 8})
    assert probed["switches"]["num_workers"][0] == "0"
    assert probed["applies_when"] == {"prefetch_factor": "workers", "persistent_workers": "workers",
                                      "cpu_threads": "workers"}


def processes_marked(mark):
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if f"TRAINBENCH_TEST_MARK={mark}".encode() in f.read().split(b"\0") and _alive(int(pid)):
                    found.append(int(pid))
        except OSError:
            pass
    return found


def autotune_or_skip():
    autotune = built_tool("TRAINBENCH_AUTOTUNE", "tuner", "autotune")
    if autotune is None:
        pytest.skip("autotune is not built")
    return autotune


def test_a_hung_and_a_failing_loader_worker_each_cost_one_candidate_and_leave_nothing_running(tmp_path):
    """faulty_loader.py:build raises in its one worker (num_workers=1) and hangs in its two (num_workers=2): each is
    one failed trial (the worker's reason; the hang stopped by the watchdog), the tune chooses, and no process of it
    is left, loader workers included."""
    mark = uuid.uuid4().hex
    out = tmp_path / "t.json"
    done = subprocess.run([autotune_or_skip(), "--gpu", "cpu", "--entry", f"{FAULTY}:build", "--batch", "16",
                           "--micro-batch", "8", "--switches", "num_workers", "--budget", "120", "--trial-seconds", "1",
                           "--race-rounds", "2", "--format", "json", "--journal", str(tmp_path / "j.jsonl"),
                           "--out", str(out)],
                          capture_output=True, text=True, timeout=300, env=dict(os.environ, TRAINBENCH_TEST_MARK=mark))
    assert done.returncode == 0, done.stderr
    time.sleep(0.5)
    assert processes_marked(mark) == [], "a process of the tune outlived it"
    t = json.loads(out.read_text())["trainbench_autotune"]
    assert t["chosen"]["switches"]["num_workers"] == "0"
    assert t["chosen"]["dataloader"]["num_workers"] == 0 and t["chosen"]["dataloader"]["prefetch_factor"] is None
    split = t["time_split"]["chosen"]   # the step's parts, timed after the race
    assert set(split["parts"]) == {"data", "forward_backward", "optimizer", "communication", "sync"}
    assert abs(split["parts_sum_ms"] - split["step_ms"]) <= 0.05 * split["step_ms"], split
    assert split["timed_step_ms"] > 0 and split["whole_step_ms"] > 0 and split["steps"] >= 3
    assert "where the chosen configuration's" in done.stderr
    failed = {f["config"].split("num_workers=")[1].split()[0]: f for f in t["failed_trials"]}
    assert failed["1"]["class"] == "error" and "sample" in failed["1"]["message"], failed
    assert failed["2"]["class"] == "timeout", failed


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL])
def test_a_stopped_tune_leaves_no_loader_worker_running(tmp_path, stop):
    """autotune stopped (SIGTERM, kill -9) while a candidate's loader workers run: none of its processes is left."""
    mark = uuid.uuid4().hex
    proc = subprocess.Popen([autotune_or_skip(), "--gpu", "cpu", "--entry", f"{AUGMENTED}:build", "--batch", "16",
                             "--micro-batch", "16", "--switches", "num_workers", "--budget", "120",
                             "--journal", str(tmp_path / "j.jsonl"), "--out", str(tmp_path / "t.yaml")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=dict(os.environ, TRAINBENCH_TEST_MARK=mark))
    try:
        deadline = time.monotonic() + 120
        # autotune, its worker, and at least one loader worker (a child of the worker)
        while len(processes_marked(mark)) < 3 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert len(processes_marked(mark)) >= 3, "no loader worker started"
        proc.send_signal(stop)
        proc.wait(60)
        deadline = time.monotonic() + 15
        while processes_marked(mark) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert processes_marked(mark) == [], f"processes outlived autotune's {signal.Signals(stop).name}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
