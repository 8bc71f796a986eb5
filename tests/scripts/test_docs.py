"""The README and docs/ stay true: every relative link resolves (to a heading, for `#anchor` links), and every
benchsuite, autotune or scripts/<tool> command they quote uses only long flags the tool's source declares
(CLI11's add_option/add_flag, argparse's add_argument, a shell script's case patterns). Reads sources only:
no build, no GPU, no PyTorch."""
import pathlib
import re
import shlex

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SHELL_FENCES = {"", "sh", "bash", "shell", "console"}


def markdown_files():
    return [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))


def split_markdown(text):
    """(prose, fenced blocks): the prose with every fenced block blanked out, and each block as (language, text)."""
    prose, blocks, fence, body = [], [], None, []
    for line in text.split("\n"):
        m = re.match(r"^\s*(```|~~~)\s*(\S*)", line)
        if fence is None and m:
            fence, language, body = m.group(1), m.group(2), []
            prose.append("")
        elif fence is not None and line.strip().startswith(fence):
            blocks.append((language, "\n".join(body)))
            fence = None
            prose.append("")
        elif fence is not None:
            body.append(line)
            prose.append("")
        else:
            prose.append(line)
    return "\n".join(prose), blocks


INLINE_CODE = re.compile(r"`([^`]+)`")


def github_anchor(heading):
    """GitHub's rule: lowercase, punctuation other than '-' and '_' dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path):
    seen, result = {}, set()
    prose, _ = split_markdown(path.read_text())
    for line in prose.split("\n"):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base = github_anchor(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            result.add(base if n == 0 else f"{base}-{n}")
    return result


def broken_links(path):
    prose, _ = split_markdown(path.read_text())
    prose = INLINE_CODE.sub("", prose)
    problems = []
    for target in re.findall(r"\[[^\]]*\]\(([^)\s]+)\)", prose):
        if re.match(r"^[a-z]+:", target):   # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        where = (path.parent / file_part).resolve() if file_part else path
        if not where.exists():
            problems.append(f"{target}: no such file")
        elif anchor and (where.suffix != ".md" or anchor not in anchors(where)):
            problems.append(f"{target}: no heading #{anchor} in {where.name}")
    return problems


def quoted_commands(text):
    """Commands in shell code blocks (one a line, continuations joined) and in inline code."""
    prose, blocks = split_markdown(text)
    commands = [" ".join(span.split()) for span in INLINE_CODE.findall(prose) if "\n\n" not in span]
    for language, body in blocks:
        if language not in SHELL_FENCES:
            continue
        joined = []
        for line in body.split("\n"):
            continues = joined and (joined[-1].rstrip().endswith(("\\", "|")) or (line[:1].isspace() and joined[-1].strip()))
            if continues:
                joined[-1] = joined[-1].rstrip().rstrip("\\") + " " + line.strip()
            else:
                joined.append(line)
        commands += joined
    return commands


def read(rel):
    return (ROOT / rel).read_text()


def cli11_flags(*sources):
    return {m for s in sources for m in re.findall(r'"(--[A-Za-z][\w-]*)[",]', read(s))}


def script_flags(tool):
    path = ROOT / "scripts" / tool
    text = path.read_text()
    if "python" not in text.split("\n", 1)[0]:   # a shell script: its case patterns and [[ == --x ]] tests
        return set(re.findall(r"(--[A-Za-z][\w-]*)\)", text)) | set(re.findall(r"== (--[A-Za-z][\w-]*)", text))
    sources = [text] + [p.read_text() for p in sorted((ROOT / "scripts" / "trainbench").rglob("*.py"))]
    flags = set(re.findall(r"""["'](--[A-Za-z][\w-]*)["']""", text))   # the wrapper's own (torch-step --serve)
    for source in sources:
        for names in re.findall(r"add_argument\(((?:\s*[\"']-[^\"']*[\"']\s*,)+)", source):
            flags |= set(re.findall(r"""["'](--[A-Za-z][\w-]*)["']""", names))
    return flags


def accepted_flags(tool):
    """The long flags a tool accepts, from its source; None for a path under scripts/ that is no tool."""
    if tool == "benchsuite":
        return cli11_flags("benches/benchsuite.cpp") | {"--help", "--benchmark_*"}
    if tool == "autotune":
        return cli11_flags("tuner/autotune.cpp", "tuner/autotune_options.cpp", "tuner/autotune_main.cpp") | {"--help"}
    if not (ROOT / "scripts" / tool).is_file():
        return None
    return script_flags(tool) | {"--help"}


def tool_of(token):
    if token == "benchsuite" or token.endswith("/benchsuite"):
        return "benchsuite"
    if token == "autotune" or token.endswith("/autotune"):
        return "autotune"
    m = re.match(r"^scripts/([\w.-]+)$", token)
    return m.group(1) if m else None


def bad_flags(command, flags_of=accepted_flags):
    """What is wrong with one quoted command line: unknown flags, or a scripts/ path that is no tool."""
    problems = []
    for segment in re.split(r"\s(?:\|\||&&|\||;)\s", command):
        try:
            tokens = shlex.split(segment, comments=True)
        except ValueError:
            tokens = segment.split()
        while tokens and re.match(r"^\w+=", tokens[0]):   # VAR=value before the command
            tokens = tokens[1:]
        if tokens and tokens[0] in ("python3", "python"):
            tokens = tokens[1:]
        if tokens and tokens[0] == "mpirun":   # mpirun's own options, then the tool
            tokens = tokens[next((i for i, t in enumerate(tokens) if tool_of(t)), len(tokens)):]
        if not tokens or not tool_of(tokens[0]):
            continue
        tool = tool_of(tokens[0])
        accepted = flags_of(tool)
        if accepted is None:
            if "/" not in tool and "." not in tool:
                problems.append(f"scripts/{tool}: no such tool")
            continue
        for token in tokens[1:]:
            if token == "--":   # what follows goes to another program
                break
            m = re.match(r"^\[?(--[A-Za-z][\w-]*)", token)
            if not m:
                continue
            flag = m.group(1)
            if flag in accepted or (flag.startswith("--benchmark_") and "--benchmark_*" in accepted):
                continue
            problems.append(f"{tool} {flag}: not a flag of {tool}")
    return problems


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path):
    assert broken_links(path) == []


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_quoted_commands_use_flags_the_tools_declare(path):
    problems = [f"{c!r}: {p}" for c in quoted_commands(path.read_text()) for p in bad_flags(c)]
    assert problems == []


def test_the_flags_come_from_the_sources():
    assert {"--filter", "--quick", "--axis", "--torch-inputs"} <= accepted_flags("benchsuite")
    assert {"--workload", "--entry", "--versus", "--predict", "--trial"} <= accepted_flags("autotune")
    assert {"--interleave", "--fail-on-unconfirmed"} <= accepted_flags("compare")
    assert {"--listing", "--serve"} <= accepted_flags("torch-peers")
    assert "--torch" in accepted_flags("install-deps")
    assert "--minutes" in accepted_flags("gpu-node")


def test_a_made_up_flag_or_tool_is_caught():
    assert bad_flags("build/benches/benchsuite --quick --made-up-flag 3") == [
        "benchsuite --made-up-flag: not a flag of benchsuite"]
    assert bad_flags("mpirun -n 2 build/tuner/autotune --gpu cpu --nope") == ["autotune --nope: not a flag of autotune"]
    assert bad_flags("scripts/compare --interleave A B --rounds 4 -- --backend cpu --quick") == []
    assert bad_flags("benchsuite --benchmark_format=json | scripts/no-such-tool --x") == ["scripts/no-such-tool: no such tool"]
    assert bad_flags("scripts/nightly --benchsuite b --bogus") == ["nightly --bogus: not a flag of nightly"]


def test_a_broken_link_or_anchor_is_caught(tmp_path):
    (tmp_path / "page.md").write_text("# A `--flag`: here\n\n[ok](page.md#a---flag-here) [gone](nowhere.md) "
                                      "[bad](page.md#nope) `[not a link](x.md)`\n")
    assert broken_links(tmp_path / "page.md") == [
        "nowhere.md: no such file", "page.md#nope: no heading #nope in page.md"]
