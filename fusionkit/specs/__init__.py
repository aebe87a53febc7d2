"""Fusion specs in YAML: schema (pydantic v2), loader/compiler, and dumper.

All three are derived from one vocabulary (:mod:`fusionkit.vocabulary`): YAML
uses the Python names. A spec never runs code without consent: Python it names
is imported only with ``trust=True`` / ``allow_modules=[...]``.
"""

from fusionkit.specs.compile import (
    PythonRef,
    SpecError,
    SpecSummary,
    load_spec_file,
    load_spec_text,
    load_specs,
    validate_specs,
)
from fusionkit.specs.dump import DumpError, python_ref, rule_to_data, rules_to_yaml
from fusionkit.specs.equality import rules_equal
from fusionkit.specs.schema import SPEC_VERSION, SpecFile


def json_schema() -> dict[str, object]:
    """The JSON Schema of spec files, for editors."""
    schema = SpecFile.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "fusionkit spec"
    return schema


__all__ = [
    "SPEC_VERSION",
    "DumpError",
    "PythonRef",
    "SpecError",
    "SpecFile",
    "SpecSummary",
    "json_schema",
    "load_spec_file",
    "load_spec_text",
    "load_specs",
    "python_ref",
    "rule_to_data",
    "rules_equal",
    "rules_to_yaml",
    "validate_specs",
]
