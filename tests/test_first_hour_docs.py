"""What a new user reads in the first hour is whole: adding a model is documented with
names that exist, the job by hand names its tf-keras wheel, scripts/run.sh ends with the
next commands, and README says what `.ci/run` proves."""

from __future__ import annotations

import ast
import re

from model.archive import REPO_ROOT
from tpu_training.config import MODEL_NAMES

GUIDE = (REPO_ROOT / "docs" / "adding-a-model.md").read_text()
README = (REPO_ROOT / "README.md").read_text()


def python_names() -> set[str]:
    names: set[str] = set()
    for path in [*(REPO_ROOT / "training").rglob("*.py"), *(REPO_ROOT / "ops").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def test_the_guide_names_only_code_that_exists() -> None:
    named = set(re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)(?:\(\))?`", GUIDE))
    code_like = {name for name in named if "_" in name or name.isupper()}
    assert {"_TRUNKS", "task_for", "model_spec", "TF_VERSION_MODULES", "cpu_sized_model",
            "CHECKPOINT_TRUNK_BYTES"} <= code_like
    values = {*MODEL_NAMES, "serving_default", "TF_USE_LEGACY_KERAS", "TPU_STACK_STRATEGY"}
    assert code_like - values <= python_names()
    assert "[docs/adding-a-model.md]" in README or "docs/adding-a-model.md" in README


def test_the_guide_lists_every_method_a_task_provides() -> None:
    tree = ast.parse((REPO_ROOT / "training" / "tpu_training" / "models.py").read_text())
    task = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ImageTask")
    methods = {n.name for n in task.body
               if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")}
    provides = GUIDE[GUIDE.index("A task provides"):GUIDE.index("Inputs come from")]
    listed = set(re.findall(r"`(\w+)\(", provides))
    assert listed == methods


def test_running_the_job_by_hand_names_the_tf_keras_wheel() -> None:
    training = (REPO_ROOT / "training" / "README.md").read_text()
    for text in (training, GUIDE):
        assert "pip install --no-deps 'tf-keras>=2.18,<2.19'" in text
    assert "TPU_STACK_STRATEGY=cpu" in GUIDE and "-m tpu_training synth" in GUIDE
    assert "-m tpu_training run --config" in GUIDE


def test_run_sh_ends_with_the_commands_to_try_next() -> None:
    script = (REPO_ROOT / "scripts" / "run.sh").read_text()
    after = script[script.index("./tpuctl rehearse"):]
    assert "Next:" in after
    for command in ("./tpuctl status --stack $stack --offline",
                    "./tpuctl logs --stack $stack --offline", "scripts/test.sh"):
        assert command in after


def test_readme_says_what_ci_proves() -> None:
    assert ".ci/run proves both\n" not in README and "`.ci/run` proves both on" not in README
    assert "`.ci/run` proves both commands, and both Python minimums" in README
