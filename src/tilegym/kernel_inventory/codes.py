"""Stable finding codes of the kernel inventory checks, one per rule.

Codes never change meaning; a retired rule keeps its number unused. ``CODES`` maps each code
to a one-line summary (``tilegym-inventory codes`` prints the table).

======  ==============================================================================
code    rule
======  ==============================================================================
INV001  file is missing or cannot be read
INV002  file is larger than the size cap
INV003  file is not UTF-8 text (binary content)
INV004  file is not well-formed JSON
INV005  JSON object has a duplicate key
INV006  file is neither a Definition nor a Solution (cannot tell which schema applies)
INV010  schema violation (other)
INV011  unknown key (``additionalProperties: false``)
INV012  required key missing
INV013  value has the wrong JSON type
INV014  value not allowed (enum, const, pattern, range, length)
INV020  Definition ``name`` differs from the file stem
INV021  Solution file stem differs from its ``definition``
INV022  Definition has no Solution with the same stem in the model directory
INV023  Solution has no Definition with the same stem in the model directory
INV030  ``reference`` is not valid Python
INV031  ``reference`` does not start with a ``# Source:`` line
INV032  ``# Source:`` line is not a precise permalink
INV033  ``reference`` has no top-level ``run`` function
INV034  ``run`` positional parameters differ from the ``inputs`` keys (names and order)
INV035  tensor shape uses an axis that ``axes`` does not declare
INV036  constraint is not a Python expression over declared axis names
INV037  a name is both an input and an output
INV038  tag is not namespaced (``namespace:value``)
INV039  ``mutates:<input>`` tag names no input
INV040  Solution source path is absolute, escapes the repository or is not normalized
INV041  Solution source file does not exist
INV042  entry point file is not among the Solution sources
INV043  entry point function is not defined at the top level of its file
INV044  ``target_hardware`` entry is not ``SM<NN>``
INV045  ``entry_point`` is not ``path/to/file.py::function``
INV046  duplicate Solution source path
INV047  entry point's positional parameters do not take the Definition's inputs (and outputs)
INV048  ``entry_kwargs`` and the entry point's keyword-only parameters disagree
INV049  ``index_of`` names no axis of the Definition or is on a non-integer input
INV050  cited source could not be fetched (network or clone problem)
INV051  cited commit does not exist
INV052  cited file does not exist at that commit
INV053  cited line range is past the end of the file
INV054  cited line range is blank
INV055  output ``tolerance`` is on a non-float output or looser than its inputs' precision
INV060  entry module failed to import
INV061  entry module defines no ``aot_signatures()``
INV062  ``aot_signatures()`` failed or returned something other than {kernel: [KernelSignature]}
INV063  a ``@ct.kernel`` defined in the entry module is missing from ``aot_signatures()``
INV064  kernel failed to compile for an architecture
INV065  the cuTile compile toolchain is not available
INV070  Solution entry point could not be loaded or raised
INV071  output differs from the reference beyond the dtype tolerance
INV072  output holds NaN or Inf where the reference is finite (or was left unwritten)
INV073  an input was modified although no ``mutates:<input>`` tag declares it
INV074  output count, shape or dtype differs from the Definition
INV075  reference ``run`` failed
INV076  no shape satisfies the constraints
INV077  dtype or device not supported by the parity runner
======  ==============================================================================
"""

from __future__ import annotations

import re

CODES: dict[str, str] = {}
for _match in re.finditer(r"^(INV\d{3})  (.+)$", __doc__ or "", re.MULTILINE):
    CODES[_match.group(1)] = _match.group(2).strip()
del _match

FILE_UNREADABLE = "INV001"
FILE_TOO_LARGE = "INV002"
FILE_BINARY = "INV003"
JSON_MALFORMED = "INV004"
JSON_DUPLICATE_KEY = "INV005"
FILE_KIND_UNKNOWN = "INV006"
SCHEMA_OTHER = "INV010"
SCHEMA_UNKNOWN_KEY = "INV011"
SCHEMA_MISSING_KEY = "INV012"
SCHEMA_WRONG_TYPE = "INV013"
SCHEMA_BAD_VALUE = "INV014"
NAME_STEM = "INV020"
SOLUTION_STEM = "INV021"
DEFINITION_UNPAIRED = "INV022"
SOLUTION_UNPAIRED = "INV023"
REFERENCE_SYNTAX = "INV030"
REFERENCE_NO_SOURCE = "INV031"
PERMALINK_INVALID = "INV032"
REFERENCE_NO_RUN = "INV033"
RUN_SIGNATURE = "INV034"
UNDECLARED_AXIS = "INV035"
CONSTRAINT_INVALID = "INV036"
INPUT_OUTPUT_CLASH = "INV037"
TAG_NOT_NAMESPACED = "INV038"
MUTATES_UNKNOWN = "INV039"
SOURCE_PATH_INVALID = "INV040"
SOURCE_MISSING = "INV041"
ENTRY_NOT_IN_SOURCES = "INV042"
ENTRY_FUNCTION_MISSING = "INV043"
HARDWARE_INVALID = "INV044"
ENTRY_POINT_FORMAT = "INV045"
SOURCE_DUPLICATE = "INV046"
ENTRY_SIGNATURE = "INV047"
ENTRY_KWARGS = "INV048"
INDEX_OF_INVALID = "INV049"
CITE_UNREACHABLE = "INV050"
CITE_NO_COMMIT = "INV051"
CITE_NO_FILE = "INV052"
CITE_BAD_RANGE = "INV053"
CITE_BLANK = "INV054"
TOLERANCE_INVALID = "INV055"
COMPILE_IMPORT = "INV060"
COMPILE_NO_SIGNATURES = "INV061"
COMPILE_BAD_SIGNATURES = "INV062"
COMPILE_KERNEL_UNDECLARED = "INV063"
COMPILE_FAILED = "INV064"
COMPILE_NO_TOOLCHAIN = "INV065"
PARITY_LOAD = "INV070"
PARITY_MISMATCH = "INV071"
PARITY_NONFINITE = "INV072"
PARITY_INPUT_MODIFIED = "INV073"
PARITY_OUTPUT_FORM = "INV074"
PARITY_REFERENCE_FAILED = "INV075"
PARITY_NO_SHAPE = "INV076"
PARITY_UNSUPPORTED = "INV077"
