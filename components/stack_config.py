"""Where the stack config comes from: the one place it is read.

`program_config()` is what the Pulumi CLI hands a running program;
`file_config(stack)` builds the same mapping from the files, exactly as the CLI
would: Pulumi.yaml's project config merged under Pulumi.<stack>.yaml, with the
CLI's rules and messages (a required key left unset fails the stack), both
files read as YAML 1.2 like the CLI's YAML library. Offline plans and tests
therefore see what `pulumi up` sees, or fail where it fails.
"""

from __future__ import annotations

import difflib
import json
import re
from pathlib import Path
from typing import Any

import yaml
from pulumi.runtime import config as runtime_config

from model.archive import REPO_ROOT
from model.settings.load import load_settings
from model.settings.schema import NAMESPACE, StackSettings

# A declaration's attributes: pulumi/pulumi sdk/go/common/workspace/project.json,
# $defs.configTypeDeclaration (additionalProperties: false).
DECLARATION_KEYS = frozenset({"type", "items", "description", "secret", "default", "value"})


class StackFileError(ValueError):
    """A missing or unreadable Pulumi.<stack>.yaml, or one the CLI would refuse."""


class Yaml12Loader(yaml.SafeLoader):
    """Plain scalars resolved as the Pulumi CLI's YAML library (gopkg.in/yaml.v3,
    resolve.go) resolves them, not as PyYAML's YAML 1.1: `yes`, `no`, `on`,
    `off`, `y`, `n` stay strings; only true/True/TRUE and false/False/FALSE are
    booleans; `1:30` is a string, not the sexagesimal 90; `0o17` is octal, and
    so is `017` (yaml.v3 keeps 1.1 octals "for compatibility"); `1_000` is
    1000; a date such as 2024-01-02 is a timestamp (yaml.v3 decodes it as
    time.Time, which the CLI hands the program as Go's time.String() text).
    Sources: yaml.org/spec/1.2.2 section 10.3.2 (core schema); go-yaml/yaml v3
    resolve.go and decode.go."""


Yaml12Loader.yaml_implicit_resolvers = {}  # type: ignore[assignment] # drop the 1.1 ones


def _resolver(tag: str, pattern: str, first: str) -> None:
    Yaml12Loader.add_implicit_resolver(tag, re.compile(pattern, re.X), list(first))


_resolver("tag:yaml.org,2002:bool", r"^(?:true|True|TRUE|false|False|FALSE)$", "tTfF")
_resolver("tag:yaml.org,2002:null", r"^(?:~|null|Null|NULL|)$", ["~", "n", "N", ""])
_resolver("tag:yaml.org,2002:int",
          r"^[-+]?(?:0[xX][0-9a-fA-F_]+|0[oO][0-7_]+|0[bB][01_]+|[0-9][0-9_]*)$",
          "-+0123456789")
_resolver("tag:yaml.org,2002:float",
          r"""^(?:[-+]?(?:\.[0-9]+|[0-9][0-9_]*(?:\.[0-9_]*)?)(?:[eE][-+]?[0-9]+)?
              |[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$""",
          "-+0123456789.")
_resolver("tag:yaml.org,2002:merge", r"^(?:<<)$", "<")
# yaml.v3 resolve.go, allowedTimestampFormats: a date, or a date and time.
_TIMESTAMP = (r"^(?P<date>[0-9]{4}-[0-9]{1,2}-[0-9]{1,2})"
              r"(?:[Tt ](?P<time>[0-9]{1,2}:[0-9]{1,2}:[0-9]{1,2})(?:\.(?P<frac>[0-9]+))?"
              r"(?P<zone>Z|[-+][0-9]{2}:[0-9]{2})?)?$")
_resolver("tag:yaml.org,2002:timestamp", _TIMESTAMP, "0123456789")


def _int_1_2(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    text = loader.construct_scalar(node).replace("_", "")
    sign = -1 if text[:1] == "-" else 1
    digits = text.lstrip("+-")
    if digits[:2].lower() in ("0x", "0o", "0b"):
        return sign * int(digits, 0)
    if len(digits) > 1 and digits[0] == "0" and set(digits) <= set("01234567"):
        return sign * int(digits, 8)  # yaml.v3: Go's ParseInt(base 0) reads 017 as octal
    return sign * int(digits, 10)


def _float_1_2(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> float:
    text = loader.construct_scalar(node).replace("_", "").lower()
    if text.endswith("inf"):
        return float("-inf") if text.startswith("-") else float("inf")
    return float("nan") if text == ".nan" else float(text)


def _timestamp_text(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> str:
    """A timestamp as the program receives it: pulumi/pulumi
    sdk/go/common/resource/config/object.go, unmarshalObject, turns yaml.v3's
    time.Time into its String() (Go layout "2006-01-02 15:04:05.999999999 -0700 MST")."""
    match = re.match(_TIMESTAMP, loader.construct_scalar(node))
    assert match, "resolved by _TIMESTAMP"
    year, month, day = (int(part) for part in match["date"].split("-"))
    hour, minute, second = (int(p) for p in (match["time"] or "0:0:0").split(":"))
    frac = (match["frac"] or "").rstrip("0")
    zone = match["zone"] or "Z"
    offset = "+0000 UTC" if zone == "Z" else f"{zone.replace(':', '')} {zone.replace(':', '')}"
    return (f"{year:04d}-{month:02d}-{day:02d} {hour:02d}:{minute:02d}:{second:02d}"
            f"{'.' + frac if frac else ''} {offset}")


Yaml12Loader.add_constructor("tag:yaml.org,2002:timestamp", _timestamp_text)
Yaml12Loader.add_constructor("tag:yaml.org,2002:int", _int_1_2)
Yaml12Loader.add_constructor("tag:yaml.org,2002:float", _float_1_2)


def load_yaml(text: str) -> Any:
    """YAML text as the Pulumi CLI reads it (YAML 1.2, see Yaml12Loader)."""
    return yaml.load(text, Loader=Yaml12Loader)  # a SafeLoader subclass: safe


def program_config() -> dict[str, Any]:
    """Every config value of the running program (PULUMI_CONFIG and any set
    explicitly, as under the mock engine)."""
    return {**runtime_config.get_config_env(), **runtime_config.CONFIG.get()}


def cli_value(value: Any) -> str:
    """A config value as the CLI passes it (pulumi/pulumi
    sdk/go/common/resource/config/object.go, MarshalString): strings as they are,
    everything else as Go's encoding/json writes it (compact, map keys sorted,
    1.0 as 1)."""
    if isinstance(value, str):
        return value
    return json.dumps(_go_numbers(value), separators=(",", ":"), sort_keys=True)


def _go_numbers(value: Any) -> Any:
    """Whole floats as Go's encoding/json writes them (1.0 → 1)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        return int(value)
    if isinstance(value, dict):
        return {key: _go_numbers(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_go_numbers(item) for item in value]
    return value


def _full_key(key: str) -> str:
    return key if ":" in key else f"{NAMESPACE}:{key}"


def _read(path: Path) -> dict[str, Any]:
    try:
        data = load_yaml(path.read_text())
    except yaml.YAMLError as error:
        raise StackFileError(f"{path.name}{_where(error)}: not valid YAML: "
                             f"{_what(error)}") from None
    except OSError as error:
        raise StackFileError(f"cannot read {path.name}: {error.strerror}") from None
    if data is not None and not isinstance(data, dict):
        raise StackFileError(f"{path.name} must be a mapping")
    return data or {}


def project_declarations(root: Path = REPO_ROOT) -> dict[str, dict[str, Any]]:
    """Pulumi.yaml's `config`, each key as a declaration (`{default|value, type, …}`).

    pulumi/pulumi sdk/go/common/workspace/project.go, RewriteShorthandConfigValues:
    a plain scalar or array is shorthand for `default` (a key of this project)
    or `value` (another namespace, e.g. gcp:project); an object must be a
    declaration, and Project.Validate's rules apply."""
    project = _read(root / "Pulumi.yaml")
    declarations: dict[str, dict[str, Any]] = {}
    for key, declared in (project.get("config") or {}).items():
        ours = ":" not in key or key.startswith(f"{NAMESPACE}:")
        if not isinstance(declared, dict):
            declared = {"default" if ours else "value": declared}
        _check_declaration(key, declared, ours)
        declarations[key] = declared
    return declarations


def _check_declaration(key: str, declared: dict[str, Any], ours: bool) -> None:
    """Project.Validate (project.go) and the schema's configTypeDeclaration."""
    unknown = sorted(set(declared) - DECLARATION_KEYS)
    if unknown:  # project.json: additionalProperties false (pulumi/pulumi#16056)
        raise StackFileError(f"Pulumi.yaml: config '{key}': additionalProperties "
                             f"{', '.join(repr(k) for k in unknown)} not allowed (an object "
                             f"value goes under 'default' or 'value')")
    if declared.get("default") is not None and declared.get("value") is not None:
        raise StackFileError(f"project config '{key}' cannot have both a 'default' and "
                             f"'value' attribute")
    if not ours and ("type" in declared or declared.get("default") is not None):
        raise StackFileError(f"Configuration key '{key}' is not namespaced by the project "
                             f"and should define only a 'value'")
    if declared.get("type") == "array" and "items" not in declared:
        raise StackFileError(f"The configuration key '{key}' declares an array but does not "
                             f"specify the underlying type via the 'items' attribute")
    default = declared.get("default")
    if "type" in declared and default is not None and not _has_type(declared, default):
        raise StackFileError(f"The default value specified for configuration key '{key}' is "
                             f"not of the expected type '{_type_name(declared)}'")


def project_defaults(root: Path = REPO_ROOT) -> dict[str, Any]:
    """Pulumi.yaml's defaults and values, by full key (keys without either are absent)."""
    return {_full_key(key): _fallback(declared)
            for key, declared in project_declarations(root).items()
            if _fallback(declared) is not None}


def _fallback(declared: dict[str, Any]) -> Any:
    # mergeConfig: `value` is taken, then `default` overrides it (Validate forbids both).
    default = declared.get("default")
    return default if default is not None else declared.get("value")


def stack_names(root: Path = REPO_ROOT) -> list[str]:
    return sorted(p.name[len("Pulumi."):-len(".yaml")] for p in root.glob("Pulumi.*.yaml"))


def stack_file_config(stack: str, root: Path = REPO_ROOT) -> dict[str, Any]:
    """Pulumi.<stack>.yaml's `config`, by full key, values as YAML 1.2 reads them."""
    path = root / f"Pulumi.{stack}.yaml"
    if not path.exists():
        known = ", ".join(stack_names(root)) or "none"
        raise StackFileError(f"no stack file {path.name} (stacks here: {known})")
    values = _read(path).get("config") or {}
    for key in values:
        if ":" not in str(key):  # pulumi/pulumi sdk/go/common/resource/config/key.go, ParseKey
            raise StackFileError(f"{path.name}: could not parse {key} as a configuration key "
                                 f"(configuration keys should be of the form "
                                 f"`<namespace>:<name>`, e.g. {NAMESPACE}:{key})")
    return dict(values)


def _where(error: yaml.YAMLError) -> str:
    """', line 3, column 20' (PyYAML counts from 0); PyYAML's own text names the file
    "<unicode string>", so the message is ours."""
    mark = getattr(error, "problem_mark", None)
    return f", line {mark.line + 1}, column {mark.column + 1}" if mark else ""


def _what(error: yaml.YAMLError) -> str:
    """The problem, then the line with a caret under it (PyYAML's snippet)."""
    if not isinstance(error, yaml.MarkedYAMLError):
        return str(error)
    what = "; ".join(part for part in (error.context, error.problem) if part)
    snippet = error.problem_mark.get_snippet() if error.problem_mark else None
    return f"{what}\n{snippet}" if snippet else what


def merge_config(stack: str, declarations: dict[str, dict[str, Any]],
                 stack_values: dict[str, Any]) -> dict[str, Any]:
    """The CLI's merge of project config under a stack's config.

    pulumi/pulumi pkg/workspace/config.go (sdk/go/common/workspace/config.go in
    older releases), mergeConfig: a key of this project that the stack leaves
    unset takes the declaration's `value` or `default`; one with neither is
    missing, and all missing keys fail the stack with
    missingStackConfigurationKeysError's
        fmt.Errorf("Stack '%v' is missing configuration %v %v",
                   stackName, valueOrValues, formatMissingKeys(missingKeys))
    Explicitly typed keys are then checked (validateStackConfigValue):
        "Stack '%v' with configuration key '%v' must be of type '%v'"
    """
    merged = dict(stack_values)
    missing = []
    for key in sorted(declarations):
        declared, full = declarations[key], _full_key(key)
        if full in merged:
            continue
        fallback = _fallback(declared)
        if fallback is not None:
            merged[full] = fallback
        elif full.startswith(f"{NAMESPACE}:"):
            missing.append(key)
    if missing:
        values = "values" if len(missing) > 1 else "value"
        raise StackFileError(f"Stack '{stack}' is missing configuration {values} "
                             f"{_format_missing(missing)}"
                             f"{_missing_hint(stack, missing, stack_values, declarations)}")
    for key in sorted(declarations):
        declared = declarations[key]
        if "type" in declared and not _has_type(declared, _as_cli_sees(merged[_full_key(key)])):
            raise StackFileError(f"Stack '{stack}' with configuration key '{key}' must be of "
                                 f"type '{_type_name(declared)}'")
    return merged


def _missing_hint(stack: str, missing: list[str], stack_values: dict[str, Any],
                  declarations: dict[str, dict[str, Any]]) -> str:
    """Ours, not the CLI's, one per missing key: the stack's undeclared key that looks
    like it, else the full key to set and what Pulumi.yaml says it holds."""
    declared = {_full_key(key) for key in declarations}
    strays = [key for key in stack_values if key.startswith(f"{NAMESPACE}:")
              and key not in declared]
    hints = []
    for key in sorted(missing):
        full, about = _full_key(key), declarations[key].get("description")
        match = difflib.get_close_matches(full, strays, n=1)
        hints.append(f"{match[0]} in the stack file: did you mean {full}?" if match
                     else f"set {full} in Pulumi.{stack}.yaml" + (f": {about}" if about else ""))
    return f" ({'; '.join(hints)})"


def _format_missing(keys: list[str]) -> str:
    """formatMissingKeys: 'a'; 'a' and 'b'; 'a', 'b' and 'c' (sorted)."""
    quoted = [f"'{key}'" for key in sorted(keys)]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} and {quoted[-1]}"


def _as_cli_sees(value: Any) -> Any:
    """A stack value as validateStackConfigValue checks it: scalars as their text."""
    return value if isinstance(value, (dict, list)) else cli_value(value)


def _has_type(declared: dict[str, Any], value: Any) -> bool:
    """project.go, ValidateConfigValue (string, integer, boolean, object, array<items>)."""
    return _value_has_type(declared.get("type"), declared.get("items"), value)


def _value_has_type(type_name: Any, items: Any, value: Any) -> bool:
    if type_name == "string":
        return isinstance(value, str)
    if type_name == "integer":
        if isinstance(value, bool):
            return False
        if isinstance(value, float):
            return value == int(value)
        return isinstance(value, int) or (isinstance(value, str)
                                          and re.fullmatch(r"[-+]?[0-9]+", value) is not None)
    if type_name == "boolean":
        return isinstance(value, bool) or value in ("true", "false")
    if type_name == "object":
        return isinstance(value, dict)
    if not isinstance(value, list) or not isinstance(items, dict):
        return False
    return all(_value_has_type(items.get("type"), items.get("items"), v) for v in value)


def _type_name(declared: dict[str, Any]) -> str:
    """InferFullTypeName: string, array<string>, array<array<integer>>, …"""
    items = declared.get("items")
    return f"array<{_type_name(items)}>" if isinstance(items, dict) else str(declared.get("type"))


def file_config(stack: str, root: Path = REPO_ROOT) -> dict[str, str]:
    """The program's config for `stack`, as the CLI would build it (raises
    StackFileError where the CLI would refuse the stack)."""
    merged = merge_config(stack, project_declarations(root), stack_file_config(stack, root))
    return {key: cli_value(value) for key, value in merged.items()}


def settings_for(stack: str, root: Path = REPO_ROOT) -> StackSettings:
    """The checked settings of a stack file (raises SettingsError/StackFileError)."""
    return load_settings(file_config(stack, root), stack)
