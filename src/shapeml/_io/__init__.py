"""The file layer: every file shapeml reads or writes, atomically, on the `safetensors` library."""

from ._atomic import atomic_path as atomic_path
from ._atomic import atomic_write as atomic_write
from ._errors import FileAccessError as FileAccessError
from ._errors import FileFormatError as FileFormatError
from ._errors import FileMissingError as FileMissingError
from ._errors import FileTooLargeError as FileTooLargeError
from ._errors import FolderMissingError as FolderMissingError
from ._errors import NonFiniteError as NonFiniteError
from ._errors import NonFiniteWarning as NonFiniteWarning
from ._errors import access_error as access_error
from ._errors import as_path as as_path
from ._errors import cut as cut
from ._nonfinite import allowed_nonfinite as allowed_nonfinite
from ._nonfinite import names_text as names_text
from ._nonfinite import nonfinite as nonfinite
from ._paths import check_writable as check_writable
from ._paths import same_file as same_file
from ._paths import unwritable as unwritable
from ._safetensors import read_safetensors as read_safetensors
from ._safetensors import write_safetensors as write_safetensors
from ._text import read_text as read_text
