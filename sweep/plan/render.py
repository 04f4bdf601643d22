"""Run directories from a plan: run.json, job.sbatch and the framework's launch files.

Templates are Jinja with `StrictUndefined`, so a misspelt variable is an error, not an empty
string. Every string a template outputs must come from a quoting filter, and rendering refuses
any other (Jinja's `finalize` hook): `shq` (shlex.quote) for the shell, `slurm` for #SBATCH
values (a strict pattern; #SBATCH lines are not shell-parsed, so quoting cannot help there),
`tojson` for YAML, `comment` for comments. Numbers pass as they are. A user's `templates_dir`
overrides the packaged templates file by file. Rendering is idempotent: a file whose content
would not change is not rewritten.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import shlex
import sys
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import jinja2

from sweep.core.errors import UserError
from sweep.core.runconfig import RunConfig
from sweep.core.state import ATTEMPTS_DIR, RUN_FILE, atomic_write_text, make_temp
from sweep.frameworks import get_adapter
from sweep.plan import space
from sweep.plan.resources import job_cpus, job_memory
from sweep.plan.spec import SLURM_VALUE_PATTERN, Spec

TEMPLATE_SUFFIX = ".j2"
JOB_TEMPLATE = "job.sbatch.j2"
JOB_FILE = "job.sbatch"
LAUNCH_DIR = "launch"
RUNS_DIR = "runs"
WRITE_THREADS = 32
MAX_RENDER_WORKERS = 8
RUNS_PER_WORKER = 256  # below this, starting a process costs more than it saves
_SLURM_VALUE = re.compile(SLURM_VALUE_PATTERN)
# A run folder's path appears in #SBATCH --output, where nothing can be quoted.
_SAFE_PATH = re.compile(r"^/[A-Za-z0-9._/+=@,-]*$")


class RenderError(UserError):
    """A template or input problem, located: template and line, or field and fix."""


def packaged_templates_dir() -> Path:
    """The templates shipped with llm-sweep: `templates/` beside the package (a checkout or an
    editable install), or `sweep/templates/` inside an installed package."""
    package = Path(__file__).resolve().parents[1]  # sweep/, above sweep/plan/
    for candidate in (package.parent / "templates", package / "templates"):
        if (candidate / JOB_TEMPLATE).is_file():
            return candidate
    raise RenderError(f"the packaged templates are missing (looked for {JOB_TEMPLATE} in "
                      f"{package.parent / 'templates'} and {package / 'templates'}); "
                      "reinstall llm-sweep or set `templates_dir` in the spec")


class Quoted(str):
    """Text made safe by a quoting filter: the only kind of string a template may output."""


def shq(value: Any) -> Quoted:
    """Quote one value as one bash word."""
    if isinstance(value, bool):
        value = "true" if value else "false"
    return Quoted(shlex.quote(str(value)))


def slurm_value(value: Any) -> Quoted:
    """Pass a value to an #SBATCH line only if it cannot be misread there."""
    text = str(value)
    if not _SLURM_VALUE.match(text):
        raise RenderError(f"{text!r} cannot appear in an #SBATCH line (allowed: "
                          f"{SLURM_VALUE_PATTERN}); rename it or use a simpler path")
    return Quoted(text)


def comment(value: Any) -> Quoted:
    """A value inside a # comment: one line, so it cannot end the comment."""
    return Quoted(" ".join(str(value).split()))


def shell_line(value: Any) -> Quoted:
    """A line of the user's own shell (run.setup: `module load ...`), written as it is.

    It is the user's code, so it is not quoted; the spec checked that it is one line, and it is
    checked again here, so that nothing can hide a second line from a person reading job.sbatch."""
    text = str(value)
    if "\n" in text or "\r" in text or "\0" in text:
        raise RenderError(f"{text!r}: a setup line must be one line")
    return Quoted(text)


def to_json(value: Any) -> Quoted:
    """A JSON literal; also a YAML literal, so it cannot change a YAML document's structure."""
    return Quoted(json.dumps(value, sort_keys=True))


def _only_quoted(value: Any) -> Any:
    """Jinja's finalize hook: numbers pass, strings only when a quoting filter made them."""
    if isinstance(value, str) and not isinstance(value, Quoted):
        raise RenderError(f"the string {value!r} is output unquoted; pipe it through `shq` "
                          "(a shell word), `slurm` (an #SBATCH value), `tojson` (YAML/JSON) "
                          "or `comment`")
    if value is None or isinstance(value, (list, dict, tuple, set)):
        raise RenderError(f"{value!r} cannot be output as it is; pick a field or a filter")
    return value


def make_environment(templates_dir: Path | None = None) -> jinja2.Environment:
    """The Jinja environment: the user's templates first, then the packaged ones."""
    search = [packaged_templates_dir()]
    if templates_dir is not None:
        if not templates_dir.is_dir():
            raise RenderError(f"templates_dir: {templates_dir} is not a directory; point it at a "
                              "folder holding job.sbatch.j2 and/or launch/<framework>.*.j2")
        search.insert(0, templates_dir)
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader([str(p) for p in search]),
        undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=True,
        trim_blocks=True, lstrip_blocks=True, finalize=_only_quoted)
    env.filters.update(shq=shq, slurm=slurm_value, comment=comment, tojson=to_json,
                       shell_line=shell_line)
    return env


def launch_templates(env: jinja2.Environment, framework: str) -> list[str]:
    """`launch/<framework>.*.j2`, packaged or the user's."""
    prefix = f"{LAUNCH_DIR}/{framework}."
    names = sorted(n for n in env.list_templates()
                   if n.startswith(prefix) and n.endswith(TEMPLATE_SUFFIX))
    if f"{prefix}sh{TEMPLATE_SUFFIX}" not in names:
        raise RenderError(f"framework {framework!r} has no launcher template "
                          f"{prefix}sh{TEMPLATE_SUFFIX} in the templates search path")
    return names


def render_template(env: jinja2.Environment, name: str, context: Mapping[str, Any]) -> str:
    """Render one template; any error names the template and the line."""
    try:
        return env.get_template(name).render(context)
    except jinja2.TemplateSyntaxError as error:
        where = f"{error.filename or error.name or name}:{error.lineno}"
        raise RenderError(f"{where}: template syntax error: {error.message}") from None
    except RenderError as error:
        raise RenderError(f"{_template_line(error, name)}: {error}") from None
    except jinja2.TemplateError as error:
        raise RenderError(f"{_template_line(error, name)}: {error.message or error}") from None


def _template_line(error: BaseException, name: str) -> str:
    """The deepest template frame of a traceback (Jinja maps its frames to template lines)."""
    where = name
    tb = error.__traceback__
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if filename.endswith(TEMPLATE_SUFFIX):
            where = f"{filename}:{tb.tb_lineno}"
        tb = tb.tb_next
    return where


# Plan rows → run configurations (pure) -----------------------------------------------------

def kept_rows(plan: Any) -> list[dict[str, Any]]:
    """The plan's kept configurations as plain dicts (a plan without a `status` column, e.g.
    a hand-made one, is taken as all kept)."""
    frame = plan
    if "status" in frame.columns:
        frame = frame[frame["status"] == space.KEPT]
    return [{k: _plain(v) for k, v in row.items()} for row in frame.to_dict("records")]


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value


def default_python() -> str:
    """The interpreter of this installation, for jobs whose spec names none: absolute, so a job
    needs no activated virtualenv (a venv's bin/python is a symlink that keeps the venv)."""
    return os.path.abspath(sys.executable)


class RunResolver:
    """Plan rows → RunConfigs for one spec. The identity comes from the planner
    (`space.run_config`, so run ids agree); the spec hash is computed once and the run settings
    once per distinct combination of the columns that overrides test."""

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.spec_hash = spec.spec_hash()
        self.models = {shape.name for shape in spec.model_shapes}
        self.override_keys = sorted({k for o in spec.overrides for k in o.where})
        self._settings: dict[tuple[Any, ...], dict[str, Any]] = {}

    def settings(self, row: Mapping[str, Any]) -> dict[str, Any]:
        key = tuple(row.get(k) for k in self.override_keys)
        if key not in self._settings:
            settings = self.spec.run_settings_for(dict(row)).model_dump(mode="json")
            settings["python"] = settings.get("python") or default_python()
            self._settings[key] = settings
        return self._settings[key]

    def __call__(self, row: Mapping[str, Any]) -> RunConfig:
        if str(row.get("model")) not in self.models:
            raise RenderError(f"plan row names model {row.get('model')!r}, which the spec does "
                              f"not list ({sorted(self.models)}); re-run `sweep plan`")
        try:
            config = space.run_config(self.spec, row, with_settings=False)
        except KeyError as error:
            raise RenderError(f"plan rows lack the column {error}; re-run `sweep plan`") from None
        predicted = {k: float(v) for k, v in row.items()
                     if k.startswith("mem_") and isinstance(v, (int, float))
                     and not isinstance(v, bool) and v == v and v >= 0}
        return replace(config, settings=self.settings(row), spec_hash=self.spec_hash,
                       predicted=predicted)


def resolve_run(spec: Spec, row: Mapping[str, Any]) -> RunConfig:
    """The resolved configuration of one plan row (overrides applied, memory prediction from
    the plan's `mem_*` columns as `predicted`)."""
    return RunResolver(spec)(row)


def template_context(config: RunConfig, doc: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """Everything a template may use (`doc` is config.to_json()). Values are raw; templates
    quote them with `shq`."""
    settings = config.settings
    run_id = doc["run_id"]
    return {
        "run": doc,
        "run_id": run_id,
        "run_dir": str(run_dir),
        "model": config.model,
        "layout": config.layout,
        "layout_label": config.layout.label(),
        "s": settings,
        "ranks_per_node": config.gpus_per_node,
        "gpus_per_node": None if config.gpu == "cpu" else config.gpus_per_node,
        "job_name": f"{config.sweep}.{run_id}",
        "launcher": f"{config.framework}.sh",
        "framework_version": get_adapter(config.framework).version(
            settings.get("framework_version")).key,
        "checkout_env": get_adapter(config.framework).checkout_env,
        "cpus_per_task": settings.get("cpus_per_task") or job_cpus(
            config.gpu, config.gpus_per_node, bool(settings.get("exclusive", True))),
        "mem": settings.get("mem") or job_memory(config.gpu, config.gpus_per_node,
                                                 bool(settings.get("exclusive", True)),
                                                 config.predicted),
        "nccl_timeout_s": max(int(settings.get("startup_timeout_s", 600)),
                              int(settings.get("hang_timeout_s", 300))),
    }


def render_files(env: jinja2.Environment, config: RunConfig, run_dir: Path,
                 launch_names: list[str] | None = None,
                 doc: dict[str, Any] | None = None) -> dict[str, str]:
    """The text of every file of one run folder, by relative path (`doc`: config.to_json(),
    when the caller has it already). Pure apart from reading templates."""
    doc = doc or config.to_json()
    context = template_context(config, doc, run_dir)
    files = {RUN_FILE: json.dumps(doc, indent=2, sort_keys=True) + "\n",
             JOB_FILE: render_template(env, JOB_TEMPLATE, context)}
    for name in launch_names or launch_templates(env, config.framework):
        text = render_template(env, name, context)
        if text.strip():  # a launch file of another version of the framework renders to nothing
            files[name.removesuffix(TEMPLATE_SUFFIX)] = text
    return files


# Writing ---------------------------------------------------------------------------------

def write_if_changed(path: Path, text: str, durable: bool = True) -> bool:
    """Write unless the file already holds exactly this text; returns whether it wrote.

    run.json is state (the watchdog, the workload and collect read it): written with
    sweep.core.state's fsync'd atomic writer. Scripts are derived artifacts that `sweep render`
    regenerates at will, written without an fsync each (that would make rendering a large sweep
    disk-bound: 14,000 fsyncs for the playbook). A changed script is replaced atomically
    (rename), so sbatch never reads half of it; a new one is created in place (O_EXCL), as no
    job can be reading a script that did not exist, and an interrupted write differs from the
    rendered text, so the next render repairs it."""
    try:
        if path.read_text(encoding="utf-8") == text:
            return False
        exists = True
    except FileNotFoundError:
        exists = False
    except UnicodeDecodeError:
        exists = True
    if durable:
        atomic_write_text(path, text)
        return True
    if not exists:
        try:
            with open(path, "x", encoding="utf-8") as handle:
                handle.write(text)
            return True
        except FileExistsError:
            pass
    fd, tmp = make_temp(path)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(tmp, path)
    return True


def write_run(run_dir: Path, files: Mapping[str, str]) -> int:
    """Bring one run folder to exactly these files (stale launch files go); returns how many
    were (re)written."""
    (run_dir / LAUNCH_DIR).mkdir(parents=True, exist_ok=True)
    (run_dir / ATTEMPTS_DIR).mkdir(exist_ok=True)  # Slurm's --output goes here
    written = sum(write_if_changed(run_dir / rel, text, durable=rel == RUN_FILE)
                  for rel, text in files.items())
    launch = run_dir / LAUNCH_DIR
    wanted = {run_dir / rel for rel in files}
    for stale in launch.iterdir() if launch.is_dir() else ():
        if stale.is_file() and stale not in wanted:
            stale.unlink()
    job = run_dir / JOB_FILE
    if job.stat().st_mode & 0o777 != 0o755:
        job.chmod(0o755)
    return written


def resolve_templates_dir(spec: Spec, spec_dir: Path | None) -> Path | None:
    if spec.templates_dir is None:
        return None
    path = Path(spec.templates_dir).expanduser()
    return path if path.is_absolute() else (spec_dir or Path.cwd()) / path


def render_runs(spec: Spec, plan_df: Any, out_dir: str | Path, *,
                spec_dir: Path | None = None, workers: int | None = None) -> list[Path]:
    """Write `out_dir/runs/<run_id>/` for every kept configuration; returns the run folders,
    in plan order.

    `spec_dir` anchors a relative `templates_dir` (the spec file's folder); default: cwd.
    Runs are independent, so a large plan from the planner (it carries run ids) is rendered by
    `workers` forked processes (default: one per CPU, at most 8, and none below RUNS_PER_WORKER
    runs each), each taking a contiguous slice of the plan.
    """
    out = Path(out_dir).resolve()
    if not _SAFE_PATH.match(str(out)):
        raise RenderError(f"--out: {out} has characters that #SBATCH lines cannot carry; "
                          "use a sweep folder whose path has only letters, digits and ._-/+=@,")
    rows = kept_rows(plan_df)
    if workers is None:
        workers = min(os.cpu_count() or 1, MAX_RENDER_WORKERS, len(rows) // RUNS_PER_WORKER)
    if workers <= 1 or "fork" not in multiprocessing.get_all_start_methods() \
            or any(row.get("run_id") is None for row in rows):
        return _render_slice(spec, rows, out, spec_dir)  # finds duplicates as it resolves
    _refuse_duplicate_run_ids(rows)  # slices cannot see each other's runs
    size = -(-len(rows) // workers)
    slices = [rows[start:start + size] for start in range(0, len(rows), size)]
    context = multiprocessing.get_context("fork")  # the children inherit the resolved spec
    with ProcessPoolExecutor(len(slices), mp_context=context) as pool:
        parts = pool.map(_render_slice, [spec] * len(slices), slices, [out] * len(slices),
                         [spec_dir] * len(slices))
        return [run_dir for part in parts for run_dir in part]


def _refuse_duplicate_run_ids(rows: list[dict[str, Any]]) -> None:
    """Two plan rows of one run would race for its folder; the planner's run_id column finds
    them before anything is written."""
    seen: set[Any] = set()
    for row in rows:
        if row["run_id"] in seen:
            raise RenderError(f"two plan rows resolve to the same run {row['run_id']} (the "
                              f"second: {row}); the plan has duplicate rows")
        seen.add(row["run_id"])


def _render_slice(spec: Spec, rows: list[dict[str, Any]], out: Path,
                  spec_dir: Path | None) -> list[Path]:
    env = make_environment(resolve_templates_dir(spec, spec_dir))
    launch_names = launch_templates(env, spec.framework)
    resolve = RunResolver(spec)
    rendered: dict[Path, dict[str, str]] = {}
    for row in rows:
        config = resolve(row)
        doc = config.to_json()
        run_dir = out / RUNS_DIR / doc["run_id"]
        if run_dir in rendered:
            raise RenderError(f"two plan rows resolve to the same run {doc['run_id']} "
                              f"(the second: {row}); the plan has duplicate rows")
        rendered[run_dir] = render_files(env, config, run_dir, launch_names, doc)
    for run_dir, files in rendered.items():
        write_run(run_dir, {rel: text for rel, text in files.items() if rel != RUN_FILE})
    # run.json writes are fsync-bound: in parallel, the file system commits many at once.
    with ThreadPoolExecutor(max_workers=WRITE_THREADS) as pool:
        list(pool.map(write_if_changed, (d / RUN_FILE for d in rendered),
                      (files[RUN_FILE] for files in rendered.values())))
    return list(rendered)


def run_dirs_of(out_dir: str | Path) -> list[Path]:
    """The rendered run folders of a sweep, sorted by run id."""
    root = Path(out_dir) / RUNS_DIR
    return sorted(p for p in root.iterdir() if (p / RUN_FILE).is_file()) if root.is_dir() else []

