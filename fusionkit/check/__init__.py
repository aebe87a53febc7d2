"""Checks: what a match's operands must be, asked with the ExportedProgram.

``constraints`` (the operand constraints), ``capture_parameters`` (a check's captures
as its parameters), ``folding`` (constant expressions folded into new constants when a
constraint asks for it), ``operand_dtypes`` (the dtypes an op's operands may have).
Above structural matching; below graph editing and the phase that finds matches.
"""
