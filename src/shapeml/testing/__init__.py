"""Shape contracts for pytest: check a function's annotated shapes without running its compute."""

from ._contract import ContractError as ContractError
from ._contract import check_contract as check_contract

__all__ = ["ContractError", "check_contract"]
