"""Fusion specs in YAML: schema (pydantic v2), loader/compiler, and dumper."""

from fusionkit.specs.compile import SpecError, load_spec_file, load_spec_text, load_specs
from fusionkit.specs.dump import DumpError, rule_to_data, rules_to_yaml
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
    "SpecError",
    "SpecFile",
    "json_schema",
    "load_spec_file",
    "load_spec_text",
    "load_specs",
    "rule_to_data",
    "rules_to_yaml",
]
