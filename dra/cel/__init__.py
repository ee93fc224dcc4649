"""The Kubernetes DRA CEL environment (k8s.io/dynamic-resource-allocation/cel, 1.35) on cel-python.

Pure library: no Django, no database. See compiler.py for the compile/evaluate path, cache.py for
the fleet-scale memo, checker.py for compile-time errors and hints.
"""
from .cache import SelectorCache
from .compiler import (
                       MAX_EXPRESSION_LENGTH,
                       MAX_NESTING_DEPTH,
                       CompiledExpression,
                       check_selector_cost,
                       compile_expression,
                       compile_selector,
)
from .cost import MAX_SELECTOR_COST, REQUEST_COST_BUDGET, UPSTREAM_MAX_SELECTOR_COST
from .device import CELDevice
from .errors import CELBudgetExceeded, CELCompileError, CELCostLimitExceeded, CELError, CELRuntimeError
from .evaluator import DEFAULT_COST_LIMIT, DEFAULT_TIME_LIMIT_S
from .lint import validate_expression
from .meter import CostBudgetExhausted, CostMeter, metered

__all__ = [
    "CELBudgetExceeded",
    "CELCompileError",
    "CELCostLimitExceeded",
    "CELDevice",
    "CELError",
    "CELRuntimeError",
    "CostBudgetExhausted",
    "CostMeter",
    "CompiledExpression",
    "DEFAULT_COST_LIMIT",
    "DEFAULT_TIME_LIMIT_S",
    "MAX_EXPRESSION_LENGTH",
    "MAX_NESTING_DEPTH",
    "MAX_SELECTOR_COST",
    "REQUEST_COST_BUDGET",
    "UPSTREAM_MAX_SELECTOR_COST",
    "SelectorCache",
    "check_selector_cost",
    "compile_expression",
    "compile_selector",
    "metered",
    "validate_expression",
]
