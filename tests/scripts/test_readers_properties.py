"""Property tests (Hypothesis) of the readers of what trainbench did not write itself: result files and history
folders (scripts/trainbench/tracking), the PyTorch worker's start request and its requests (worker.py), `hf:` entry
queries and the dict an entry's function returns (entry.py). The property of each: any input gives a value or the
project's one-line error (ResultFileError, UsageError, EntryError; a request's {"error": ...} answer), never another
exception. Inputs are valid documents changed in a few places as well as arbitrary bytes and text, so that the
examples reach past the first check.

Bounded for CI: each property runs EXAMPLES examples, derandomized (the same examples every run, until Hypothesis
or the test changes), with no example database written into the checkout and no deadline (a loaded 2-core machine).
Without Hypothesis the file skips, saying so; the entry's property needs PyTorch (the torch venv's run of this file)."""

import io
import json
import os
import tempfile
import types

import pytest

hypothesis = pytest.importorskip("hypothesis", reason="Hypothesis is not installed (scripts/install-deps installs it)")
from hypothesis import HealthCheck, example, given, settings, strategies as st  # noqa: E402

import synth  # noqa: E402
from trainbench.errors import ResultFileError, UsageError  # noqa: E402
from trainbench.pytorch.entry import EntryError, hf_settings, parse_spec  # noqa: E402
from trainbench.tracking import aa  # noqa: E402
from trainbench.tracking.history import load_history  # noqa: E402
from trainbench.tracking.resultfile import load_run, stored_name  # noqa: E402

EXAMPLES = 200
bounded = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
pytestmark = pytest.mark.python_only

# ---- values -------------------------------------------------------------------------------------------------------
def texts(max_size):
    """Any text, with the characters that break a line or a spec (newlines, NUL, ':', '?', '&', '=') drawn often."""
    return st.text(st.characters() | st.sampled_from(["\n", "\r", "\t", "\x00", ":", "?", "&", "=", "/", " "]),
                   max_size=max_size)


# ISO dates as a result file's context.date holds them, the calendar's edges and time zones far from UTC included.
dates = (st.builds(lambda when, zone: when.isoformat() + zone, st.datetimes(),
                   st.sampled_from(["", "Z", "+00:00", "+14:00", "-12:00"]))
         | st.sampled_from(["0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-12:00"]))   # UTC is off the calendar
scalars = (st.none() | st.booleans() | st.integers() | st.floats() | texts(20) | dates
           | st.sampled_from(["", "passed", "failed", "unsupported", "cuda", "torch_cuda", "cpu", "hot", "cold"]))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts(8), inner, max_size=4),
                           max_leaves=12)


def paths_of(value, at=()):
    """Every path (keys and indices) into a decoded JSON document."""
    yield at
    if isinstance(value, dict):
        for k, v in value.items():
            yield from paths_of(v, at + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from paths_of(v, at + (i,))


def changed(doc, changes):
    """`doc` with each (path, value) set, or deleted where value is DELETE."""
    doc = json.loads(json.dumps(doc))
    for path, value in changes:
        if not path:
            doc = None if value is DELETE else value
            continue
        parent = doc
        try:
            for key in path[:-1]:
                parent = parent[key]
            if value is DELETE:
                del parent[path[-1]]
            else:
                parent[path[-1]] = value
        except (KeyError, IndexError, TypeError):   # an earlier change took the path away
            pass
    return doc


DELETE = object()
BASES = {"cpu": synth.make_run(1, 0, backend="cpu"), "cuda": synth.make_run(2, 1, backend="cuda")}
BASE_PATHS = {name: sorted(set(paths_of(doc)), key=repr) for name, doc in BASES.items()}
# The fields the readers look at (resultfile.py): a change is aimed at one of them as often as at any other place.
READ_FIELDS = {"schema", "context", "benchmarks", "date", "devices", "host", "cpu_model", "cores", "name",
               "driver_version", "runtime_version", "trainbench", "git_commit", "settings", "device", "index",
               "sm_clock_mhz", "mhz_per_cpu", "disposition", "samples_ns", "backend", "stage", "variant", "mode",
               "reason", "run_type", "aggregate_name", "disturbed", "others_cpu_share", "throttle_reasons",
               "sm_clock_min_mhz", "sm_clock_max_mhz"}
READ_PATHS = {name: [p for p in paths if p and p[-1] in READ_FIELDS] for name, paths in BASE_PATHS.items()}


@st.composite
def result_documents(draw):
    """A valid result document (CPU or CUDA) with up to four places changed (set to another JSON value, or
    removed), half of them among the fields the readers read."""
    base = draw(st.sampled_from(sorted(BASES)))
    places = st.sampled_from(READ_PATHS[base]) | st.sampled_from(BASE_PATHS[base])
    changes = draw(st.lists(st.tuples(places, st.just(DELETE) | json_values), max_size=4))
    date = draw(st.sampled_from(["kept", "kept", "removed", "another"]))
    if date != "kept":   # removed: the date is taken from the stored name
        changes.append((("context", "date"), DELETE if date == "removed" else draw(dates)))
    return changed(BASES[base], changes)


@st.composite
def result_file_bytes(draw):
    """What a result file may hold: a changed document as JSON (NaN and Infinity included), cut short or not; bytes;
    too deep a nesting; an integer of more digits than Python reads."""
    kind = draw(st.sampled_from(["document", "document", "document", "cut", "bytes", "deep", "long integer"]))
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    if kind == "deep":
        return b"[" * draw(st.integers(500, 5000))
    if kind == "long integer":
        return b'{"schema": "trainbench-results/1", "x": ' + b"7" * draw(st.integers(4301, 6000)) + b"}"
    text = json.dumps(draw(result_documents())).encode()
    return text[:draw(st.integers(0, len(text)))] if kind == "cut" else text


# Names a history folder may hold: the stored shape (a timestamp that may be no date: month 13), or any other.
file_names = (st.from_regex(r"\A[0-9]{8}T[0-9]{6}Z(-[0-9])?_[a-z0-9]{1,8}\.json\Z")
              | st.sampled_from(["result.json", "a.json", "20261001T030000Z_c000000.json"]))


def use(run):
    """What the tracking scripts read of a run once loaded: its stored name, label, rows and their clocks."""
    stored_name(run)
    assert isinstance(run.label, str) and isinstance(run.machine_key, str) and run.machine_key
    for row in run.rows.values():
        assert isinstance(row.key, str)
        assert row.median is None or row.median > 0
        assert isinstance(row.disturbance, str)
        run.clock_mhz(row)


def both_outcomes_seen(outcomes, what):
    """The examples reached both sides of the reader (a value, the error): a property that saw only one proves little."""
    assert len(outcomes) == 2, f"{what}: every example ended the same way ({', '.join(outcomes) or 'none ran'})"


# ---- result files and history folders ----------------------------------------------------------------------------
def test_a_result_file_is_read_or_refused_in_one_line():
    outcomes = set()

    @bounded
    @given(content=result_file_bytes(), name=file_names)
    @example(content=json.dumps(changed(BASES["cpu"], [(("benchmarks", 0, "name"), "peak\ncpu"),
                                                        (("benchmarks", 0, "disposition"), "fast")])).encode(),
             name="result.json")   # a row's name in the message, on one line
    @example(content=json.dumps(changed(BASES["cpu"], [(("benchmarks", 0, "backend"), "cuda"),
                                                        (("benchmarks", 0, "disposition"), "unsupported"),
                                                        (("context", "devices"), 7)])).encode(),
             name="result.json")   # GPU rows that did not run, beside devices that are no list: its clock is none
    def check(content, name):
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, name)
            with open(path, "wb") as f:
                f.write(content)
            try:
                run = load_run(path)
            except ResultFileError as e:
                assert "\n" not in str(e) and path in str(e)
                outcomes.add("refused")
                return
            use(run)
            outcomes.add("read")
    check()
    both_outcomes_seen(outcomes, "load_run")


def test_a_history_folder_is_read_or_refused_in_one_line():
    outcomes = set()

    @bounded
    @given(files=st.lists(st.tuples(file_names, result_file_bytes()), max_size=4, unique_by=lambda f: f[0]),
           folder_named_json=st.booleans(), key=st.sampled_from([None, synth.CPU_KEY, synth.GPU_KEY]),
           exclude_first=st.booleans())
    def check(files, folder_named_json, key, exclude_first):
        history_folder(files, folder_named_json, key, exclude_first, outcomes)
    check()
    both_outcomes_seen(outcomes, "aa.load_folder")


def history_folder(files, folder_named_json, key, exclude_first, outcomes):
    """load_history and aa.load_folder on a folder of `files` (name, content); `outcomes` gets how aa's ended (a
    history skips what it cannot read, with a warning: it is refused only where the folder is not one)."""
    with tempfile.TemporaryDirectory() as folder:
        for name, content in files:
            with open(os.path.join(folder, name), "wb") as f:
                f.write(content)
        if folder_named_json:
            os.mkdir(os.path.join(folder, "folder.json"))
        exclude = None
        if exclude_first and files:
            try:
                exclude = load_run(os.path.join(folder, files[0][0]))
            except ResultFileError:
                pass
        try:
            runs, warnings = load_history(folder, machine_key=key, exclude=exclude)
        except ResultFileError as e:
            assert "\n" not in str(e)
        else:
            assert all(isinstance(w, str) for w in warnings)
            for run in runs:
                use(run)
        try:
            for run in aa.load_folder(folder):
                use(run)
        except (ResultFileError, UsageError) as e:
            assert "\n" not in str(e)
            outcomes.add("refused")
        else:
            outcomes.add("read")


# ---- the PyTorch worker's start request and its requests ---------------------------------------------------------
entry_specs = (st.sampled_from(["tests/scripts/entries/small_cnn.py:build", "hf:gpt2?n_layer=2", "hf:", "x.py:", ":f",
                                "no-colon", ""]) | texts(30))
start_fields = {"kind": st.sampled_from(["entry", "twin"]) | json_values,
                "entry": entry_specs | json_values,
                "backend": st.sampled_from(["cpu", "cuda"]) | json_values,
                "device": st.integers(-2, 4) | json_values,
                "threads": st.integers(-2, 64) | json_values,
                "memory_limit_bytes": st.integers(-1, 1 << 40) | json_values,
                "distributed": st.booleans() | json_values}
start_texts = (st.fixed_dictionaries({}, optional=start_fields).map(json.dumps)
               | json_values.map(json.dumps) | texts(40))


def test_the_worker_start_request_is_read_or_refused_in_one_line():
    from trainbench.pytorch.worker import read_start
    outcomes = set()

    @bounded
    @given(text=start_texts)
    def check(text):
        try:
            start = read_start(text)
        except UsageError as e:
            assert "\n" not in str(e)
            outcomes.add("refused")
            return
        assert start["kind"] in ("entry", "twin") and start["backend"] in ("cpu", "cuda")
        assert isinstance(start["distributed"], bool)
        for name in ("device", "threads", "memory_limit_bytes"):
            assert isinstance(start[name], int) and not isinstance(start[name], bool) and start[name] >= 0
        if start["kind"] == "entry":
            parse_spec(start["entry"])
        outcomes.add("read")
    check()
    both_outcomes_seen(outcomes, "read_start")


def idle_worker():
    """A worker of the twin on the CPU with a candidate open whose step does nothing: the requests' own handling,
    without building a model (a request to open one fails as a candidate does, an answer)."""
    from collections import OrderedDict
    from trainbench.pytorch.worker import Opened, Worker
    worker = Worker.__new__(Worker)   # its __init__ imports torch and warms it up: not what is tested here
    worker.torch, worker.kind, worker.spec, worker.on_gpu, worker.world = None, "twin", "", False, None
    worker.device = types.SimpleNamespace(type="cpu", index=None)
    worker.limit, worker.can_reset_peak, worker.before_open, worker.base_threads = 0, True, 0, 1
    worker.references, worker.checked, worker.compiled, worker.streams = {}, set(), {}, OrderedDict()
    worker.opened = Opened(lambda timer=None: None, key="idle")
    return worker


# Counts a request may carry are kept small: a step that does nothing still takes a microsecond a call.
small_values = st.recursive(st.none() | st.booleans() | st.integers(-3, 300) | st.floats() | texts(10),
                            lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts(6), inner, max_size=3),
                            max_leaves=8)
request_objects = st.fixed_dictionaries({}, optional={
    "op": st.sampled_from(["open", "time", "counters", "close", "profile", "split", "probe", "largest_batch"]) | small_values,
    "calls": small_values, "steps": small_values, "failed": small_values, "candidate": small_values,
    "resolved": small_values, "reference": small_values, "warmup_steps": small_values})
request_lines = (request_objects.map(json.dumps) | small_values.map(json.dumps)
                 | texts(30).map(lambda t: " ".join(t.splitlines())))


def test_every_request_to_the_worker_gets_one_answer_and_the_conversation_goes_on():
    from trainbench.pytorch.worker import serve
    outcomes = set()

    @bounded
    @given(lines=st.lists(request_lines, min_size=1, max_size=5))
    def check(lines):
        answers = io.StringIO()
        assert serve(idle_worker(), io.StringIO("".join(line + "\n" for line in lines)), answers) == 0
        said = answers.getvalue().splitlines()
        assert len(said) == len(lines), said
        for text in said:
            answer = json.loads(text)
            assert isinstance(answer, dict)
            if "error" in answer:
                assert isinstance(answer["error"], str) and "\n" not in answer["error"]
            outcomes.add("refused" if "error" in answer else "answered")
    check()
    both_outcomes_seen(outcomes, "the worker's requests")


# ---- hf: queries --------------------------------------------------------------------------------------------------
query_pairs = st.tuples(st.sampled_from(["seq_len", "lr", "n_layer", "n_embd"]) | texts(6),
                        st.sampled_from(["=", ""]),
                        st.sampled_from(["4", "0", "-1", "1.5", "3e-4", "nan", "inf", "true", "abc", "", "1_0"])
                        | texts(6))
hf_specs = st.builds(lambda name, pairs, mark: f"hf:{name}{mark}" + "&".join(k + eq + v for k, eq, v in pairs),
                     st.sampled_from(["gpt2", "llama", ""]) | texts(8), st.lists(query_pairs, max_size=4),
                     st.sampled_from(["?", "", "??"]))


def test_an_hf_query_is_read_or_refused_in_one_line():
    outcomes = set()

    @bounded
    @given(spec=hf_specs | texts(40))
    def check(spec):
        try:
            kind, name, overrides = parse_spec(spec)
            if kind != "hf":
                return
            seq_len, lr, fields = hf_settings(name, overrides)
        except EntryError as e:
            assert "\n" not in str(e) and str(e).startswith("--entry ")
            outcomes.add("refused")
            return
        assert isinstance(seq_len, int) and seq_len >= 1 and lr > 0
        assert not {"seq_len", "lr"} & set(fields)
        outcomes.add("read")
    check()
    both_outcomes_seen(outcomes, "hf: queries")


# ---- the dict an entry's function returns (PyTorch) ---------------------------------------------------------------
ENTRY_FILE = '''"""What the test hands it: build() returns what ANSWER makes."""
ANSWER = None


def build(micro_batch, device):
    return ANSWER(micro_batch, device)
'''
MICRO = 4


def entry_parts(torch):
    """The named choices for each key of an entry's dict: each makes its value for (micro_batch, model)."""
    nn = torch.nn

    def batches(n, rows):
        return [torch.randn(rows, 3) for _ in range(n)]

    def raising_at(after, error):
        def gen(m, model):
            def g():
                for b in batches(after, m):
                    yield b
                raise error("the dataset is broken")
            return g()
        return gen

    return {
        "model": {"linear": lambda m, model: nn.Linear(3, 1), "none": lambda m, model: None,
                  "number": lambda m, model: 3, "frozen": lambda m, model: nn.Linear(3, 1).requires_grad_(False),
                  "tensor": lambda m, model: torch.zeros(2)},
        "optimizer": {"sgd": lambda m, model: torch.optim.SGD(model.parameters(), lr=0.1),
                      "adamw maker": lambda m, model: (lambda p: torch.optim.AdamW(p, lr=1e-3)),
                      "maker of a number": lambda m, model: (lambda p: 5),
                      "maker that raises": lambda m, model: (lambda p: 1 / 0),
                      "text": lambda m, model: "adam", "none": lambda m, model: None},
        "batches": {"list": lambda m, model: batches(3, m), "generator": lambda m, model: iter(batches(3, m)),
                    "raises at once": raising_at(0, ValueError), "raises after one": raising_at(1, RuntimeError),
                    "stops at once": raising_at(0, StopIteration), "empty": lambda m, model: [],
                    "wrong size": lambda m, model: batches(2, m + 1), "scalars": lambda m, model: [torch.tensor(1.0)] * 2,
                    "no tensor": lambda m, model: [1, 2, 3], "dicts": lambda m, model: [{"x": t} for t in batches(2, m)],
                    "a tensor": lambda m, model: torch.zeros(m, 3), "text": lambda m, model: "batches",
                    "number": lambda m, model: 7},
        "loss": {"mse": lambda m, model: (lambda mod, b: mod(b if torch.is_tensor(b) else b["x"]).pow(2).mean()),
                 "not scalar": lambda m, model: (lambda mod, b: mod(b)),
                 "a float": lambda m, model: (lambda mod, b: 1.0),
                 "nan": lambda m, model: (lambda mod, b: mod(b).sum() * float("nan")),
                 "raises": lambda m, model: (lambda mod, b: [][1]),
                 "no grad": lambda m, model: (lambda mod, b: torch.tensor(1.0)),
                 "none": lambda m, model: None, "number": lambda m, model: 3},
        "max_grad_norm": {"1": lambda m, model: 1.0, "0": lambda m, model: 0, "none": lambda m, model: None,
                          "negative": lambda m, model: -1.0, "text": lambda m, model: "x",
                          "nan": lambda m, model: float("nan"), "inf": lambda m, model: float("inf"),
                          "list": lambda m, model: [1], "true": lambda m, model: True,
                          "huge": lambda m, model: 10 ** 400, "tensor": lambda m, model: torch.ones(2)},
    }


CHOICES = {"model": ["linear", "none", "number", "frozen", "tensor"],
           "optimizer": ["sgd", "adamw maker", "maker of a number", "maker that raises", "text", "none"],
           "batches": ["list", "generator", "raises at once", "raises after one", "stops at once", "empty", "wrong size",
                       "scalars", "no tensor", "dicts", "a tensor", "text", "number"],
           "loss": ["mse", "not scalar", "a float", "nan", "raises", "no grad", "none", "number"],
           "max_grad_norm": ["1", "0", "none", "negative", "text", "nan", "inf", "list", "true", "huge", "tensor"]}
VALID = {"model": "linear", "optimizer": "sgd", "batches": "list", "loss": "mse"}
MISSING = "(left out)"


@st.composite
def returned_dicts(draw):
    """A valid entry's dict with up to two keys changed to another choice or left out."""
    chosen = dict(VALID)
    for key in draw(st.lists(st.sampled_from(sorted(CHOICES)), max_size=2, unique=True)):
        choice = draw(st.sampled_from(CHOICES[key] + [MISSING]))
        if choice == MISSING:
            chosen.pop(key, None)
        else:
            chosen[key] = choice
    return chosen


returned_shapes = st.sampled_from(["dict"] * 6 + ["tuple", "list", "none", "text", "raises"])


@pytest.fixture(scope="module")
def entry_module(tmp_path_factory):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed here (the torch venv's run of this file "
                                                "checks an entry's returned dict)")
    from trainbench.pytorch.entry import load_function
    path = str(tmp_path_factory.mktemp("entry") / "returned.py")
    with open(path, "w") as f:
        f.write(ENTRY_FILE)
    return torch, path, load_function(path, "build").__globals__   # its module's names: ANSWER among them


def test_an_entrys_returned_dict_is_taken_or_refused_in_one_line(entry_module):
    torch, path, names = entry_module
    from trainbench.pytorch.entry import probe_entry
    parts = entry_parts(torch)

    outcomes = []

    @bounded
    @given(chosen=returned_dicts(), shape=returned_shapes)
    def check(chosen, shape):
        def answer(micro_batch, device):
            model = parts["model"]["linear"](micro_batch, None)   # what the optimizer and loss refer to
            made = {k: parts[k][name](micro_batch, model) for k, name in chosen.items()}
            if chosen.get("model") == "linear":
                made["model"] = model
            if shape == "raises":
                raise KeyError("model")
            if shape in ("tuple", "list"):
                values = [made.get(k) for k in ("model", "optimizer", "batches", "loss", "max_grad_norm") if k in made]
                return tuple(values) if shape == "tuple" else values
            return {"dict": made, "none": None, "text": "model"}[shape]
        names["ANSWER"] = answer
        try:
            probed = probe_entry({"entry": f"{path}:build", "backend": "cpu", "micro_batch": MICRO})
        except (EntryError, UsageError) as e:
            assert "\n" not in str(e) and str(e).startswith(f"--entry {path}:build")
            outcomes.append("refused")
            return
        assert probed["micro_batch"] == MICRO and probed["parameters"] > 0
        outcomes.append("taken")
    check()
    both_outcomes_seen(set(outcomes), "an entry's dict")
