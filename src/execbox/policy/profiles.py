"""Profiles: the `[profiles.NAME]` tables of a TOML file (the shipped `profiles.toml`, or the
file named by EXECBOX_PROFILES), read and validated into `Profile` models."""

from __future__ import annotations

import os
import re
import tomllib
from importlib import resources
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import ErrorDetails

from ..contract import ENVIRONMENT_NAME, Language, Limits
from ..errors import UsageError
from ..network.allowlist import parse_entries

ENV_VAR = "EXECBOX_PROFILES"

Decision = Literal["allow", "deny", "needs_approval"]

_TOP_LEVEL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_CALL_PATTERN = re.compile(r"[A-Za-z0-9_.*?\[\]!]+\Z")
_ATTRIBUTE_PATTERN = re.compile(r"[A-Za-z0-9_*?\[\]!]+\Z")
_ENVIRONMENT_NAME = re.compile(ENVIRONMENT_NAME)


def _python_only() -> list[Language]:
    return ["python"]


class Profile(BaseModel):
    """One `[profiles.NAME]` table of the profiles file: the rules and limits of a profile."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, description="The profile's name (the table's key).")
    description: str = Field(description="What the profile is for, in one line.")
    limits: Limits = Field(description="Default limits of a run under this profile.")
    max_limits: Limits = Field(description="The most a request may ask for (rule limits.max).")
    imports_allow: list[str] | None = Field(
        None, description="Top-level modules allowed; None = any module not denied."
    )
    imports_deny: list[str] = Field(default_factory=list, description="Modules refused.")
    imports_approval: list[str] = Field(
        default_factory=list, description="Modules that hold the run for approval."
    )
    calls_deny: list[str] = Field(
        default_factory=list, description="Dotted names refused; shell-style wildcards allowed."
    )
    calls_approval: list[str] = Field(
        default_factory=list, description="Dotted names that hold the run for approval."
    )
    attributes_deny: list[str] = Field(
        default_factory=list,
        description="Attribute names refused on any object (patterns); "
        "when set, getattr/setattr/delattr with a computed name are refused too.",
    )
    module_values: Literal["allow", "deny"] = Field(
        "allow",
        description="Whether a module may be used as a value (stored in a container, "
        "passed, returned), where the check cannot follow it.",
    )
    writes_outside_workspace: Literal["allow", "deny"] = Field(
        "deny", description="Whether constant-path writes outside /workspace, /tmp are denied."
    )
    missing_imports: Literal["run", "approval"] = Field(
        "run",
        description="'approval': hold a run whose code imports a top-level module its "
        "environment lacks (rule import.missing); 'run': let it fail with a hint.",
    )
    environments: list[str] | None = Field(
        None,
        description="Environments a run may name besides the executor's default, which every "
        "profile allows (rule environment.not_allowed); None = only the default.",
    )
    languages: list[Language] = Field(
        default_factory=_python_only,
        description="Languages a run may be written in (rule language.not_allowed); the "
        "import, call and write rules read Python only, so a profile with them allows only it.",
    )
    javascript_modules_deny: list[str] = Field(
        default_factory=list,
        description="Node modules JavaScript code may not require or import (rule "
        "js.module_denied); when set, a require or import the check cannot follow is refused "
        "too (rule js.dynamic).",
    )
    max_code_bytes: int = Field(ge=0, description="Cap on the code's size in UTF-8 bytes.")
    max_input_bytes: int = Field(ge=0, description="Cap on input files plus stdin, in bytes.")
    max_input_files: int = Field(ge=0, description="Cap on the number of input files.")
    max_csv_rows: int = Field(ge=0, description="Cap on the lines of each *.csv input file.")
    network_allow: list[str] = Field(
        default_factory=list,
        description="Patterns a request's network entries must fall within ('*' any name, "
        "':*' any port); empty: no network (rule network.not_allowed).",
    )
    network_approval: bool = Field(
        False, description="Whether any run with network is held for approval."
    )

    @field_validator("imports_allow", "imports_deny", "imports_approval")
    @classmethod
    def _top_level_modules(cls, names: list[str] | None) -> list[str] | None:
        # A dotted entry would silently never match (rules see top-level names only).
        for name in names or []:
            if not _TOP_LEVEL_NAME.match(name):
                top = name.split(".")[0]
                raise ValueError(
                    f"{name!r} is not a top-level module name"
                    + (f" (use {top!r})" if _TOP_LEVEL_NAME.match(top) else "")
                )
        return names

    @field_validator("environments")
    @classmethod
    def _environment_names(cls, names: list[str] | None) -> list[str] | None:
        for name in names or []:
            if not _ENVIRONMENT_NAME.fullmatch(name):
                raise ValueError(
                    f"{name!r} is not an environment name (lower-case letters, digits, '-' "
                    "and '_', starting with a letter, at most 32)"
                )
        return names

    def allowed_environments(self, default: str) -> list[str]:
        """The environments a run of this profile may name: `default` (every profile allows
        the executor's default) and those the profile lists."""
        return [default, *(e for e in self.environments or () if e != default)]

    @field_validator("calls_deny", "calls_approval")
    @classmethod
    def _dotted_patterns(cls, patterns: list[str]) -> list[str]:
        for pattern in patterns:
            if not _CALL_PATTERN.match(pattern):
                raise ValueError(
                    f"{pattern!r} is not a dotted name or wildcard pattern "
                    "(e.g. 'os.system', 'subprocess.*')"
                )
        return patterns

    @field_validator("attributes_deny")
    @classmethod
    def _attribute_patterns(cls, patterns: list[str]) -> list[str]:
        for pattern in patterns:
            if not _ATTRIBUTE_PATTERN.match(pattern):
                raise ValueError(
                    f"{pattern!r} is not an attribute name or wildcard pattern "
                    "(e.g. '__globals__', 'f_*'), without dots"
                )
        return patterns

    @field_validator("network_allow")
    @classmethod
    def _network_patterns(cls, patterns: list[str]) -> list[str]:
        parse_entries(patterns, pattern=True)
        return patterns

    @model_validator(mode="after")
    def _javascript_checked(self) -> Profile:
        # Rules about the code read Python only: JavaScript under them would run unchecked
        # unless the profile also says which Node modules it denies.
        python_rules = [
            name
            for name, value in (
                ("imports_allow", self.imports_allow is not None),
                ("imports_deny", self.imports_deny),
                ("imports_approval", self.imports_approval),
                ("calls_deny", self.calls_deny),
                ("calls_approval", self.calls_approval),
                ("attributes_deny", self.attributes_deny),
                ("module_values", self.module_values == "deny"),
                ("writes_outside_workspace", self.writes_outside_workspace == "deny"),
            )
            if value
        ]
        if "javascript" in self.languages and python_rules and not self.javascript_modules_deny:
            raise ValueError(
                f"languages lists javascript, and the profile's rules about the code "
                f"({', '.join(python_rules)}) read Python only: set javascript_modules_deny "
                "for its JavaScript, or leave javascript out of languages"
            )
        return self

    @model_validator(mode="after")
    def _defaults_within_maximums(self) -> Profile:
        # Otherwise a request that asks for nothing would be denied by its own profile.
        excess = first_excess(self.limits, self.max_limits)
        if excess is not None:
            field, value, most = excess
            raise ValueError(
                f"limits.{field} = {show_number(value)} is over max_limits.{field} = "
                f"{show_number(most)}"
            )
        return self


def load_profiles(path: Path | None = None) -> dict[str, Profile]:
    """Read the profiles file; `None` means EXECBOX_PROFILES when set, else the shipped one.

    Raises UsageError naming the file, and the profile and field, when the file is unreadable,
    not TOML, or not a valid profile definition. Keeps the file's order.
    """
    if path is None and os.environ.get(ENV_VAR):
        path = Path(os.environ[ENV_VAR])
        where = f"{path} (named by {ENV_VAR})"
    elif path is None:
        shipped = resources.files("execbox").joinpath("profiles.toml")
        where = f"the shipped profiles file {shipped}"
        try:
            return _parse_profiles(shipped.read_bytes(), where)
        except OSError as exc:
            raise UsageError(f"cannot read {where}: {exc}") from exc
    else:
        where = str(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read profiles file {where}: {exc.strerror or exc}") from exc
    return _parse_profiles(data, where)


def _parse_profiles(data: bytes, where: str) -> dict[str, Profile]:
    try:
        doc = tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise UsageError(f"profiles file {where} is not UTF-8 text: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"profiles file {where} is not valid TOML: {exc}") from exc
    unknown = sorted(set(doc) - {"profiles"})
    if unknown:
        raise UsageError(
            f"profiles file {where}: unknown top-level keys {unknown}; "
            "profiles go in [profiles.NAME] tables"
        )
    tables = doc.get("profiles")
    if not isinstance(tables, dict) or not tables:
        raise UsageError(
            f"profiles file {where} defines no profiles; add at least one [profiles.NAME] table"
        )
    profiles: dict[str, Profile] = {}
    for name, table in tables.items():
        if not isinstance(table, dict):
            raise UsageError(
                f"profiles file {where}: profile {name!r} must be a table "
                f"([profiles.{name}]), not a {type(table).__name__}"
            )
        if table.get("name", name) != name:
            raise UsageError(
                f"profiles file {where}: profile {name!r} has name = "
                f"{table['name']!r}; leave `name` out, the table key is the name"
            )
        try:
            profiles[name] = Profile.model_validate({**table, "name": name})
        except ValidationError as exc:
            raise UsageError(
                f"profiles file {where}: profile {name!r}: "
                + "; ".join(_describe(err) for err in exc.errors())
            ) from exc
    return profiles


def _describe(err: ErrorDetails) -> str:
    """One pydantic error as 'field: message', with the field as a dotted TOML key."""
    field = ".".join(str(part) for part in err["loc"])
    message = str(err["msg"]).removeprefix("Value error, ")
    return f"{field}: {message}" if field else message


def limit_value(limits: Limits, field: str) -> float:
    # cpu_s = None means "same as timeout_s": compare what is enforced, not the raw field.
    return limits.effective_cpu_s if field == "cpu_s" else float(getattr(limits, field))


# Every request's limits are compared with its profile's: the fields named once, and cpu_s
# (compared as enforced, see `limit_value`) apart from the plain numbers.
_PLAIN_LIMITS = tuple(field for field in Limits.model_fields if field != "cpu_s")


def first_excess(limits: Limits, cap: Limits) -> tuple[str, float, float] | None:
    """The first field of `limits` over `cap`'s, with both values; None when none is."""
    for field in _PLAIN_LIMITS:
        value, most = getattr(limits, field), getattr(cap, field)
        if value > most:
            return field, float(value), float(most)
        if field == "timeout_s" and limits.effective_cpu_s > cap.effective_cpu_s:
            return "cpu_s", limits.effective_cpu_s, cap.effective_cpu_s
    return None


def show_number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)
