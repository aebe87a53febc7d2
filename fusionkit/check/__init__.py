"""Phase 2, check: what a match's operands must be, asked with the ExportedProgram.

``constraints`` (the operand constraints), ``program_inputs`` (what a placeholder
is: parameter, buffer, constant or user input), ``folding`` (constant expressions
folded into new constants when a constraint asks for it).
"""
