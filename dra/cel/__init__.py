"""The Kubernetes DRA CEL environment (k8s.io/dynamic-resource-allocation/cel, 1.35) on cel-python.

Pure library: no Django, no database. See compiler.py for the compile/evaluate path, cache.py for
the fleet-scale memo, checker.py for compile-time errors and hints.
"""
from .cache import SelectorCache
from .compiler import MAX_EXPRESSION_LENGTH, MAX_NESTING_DEPTH, CompiledExpression, compile_expression
from .device import CELDevice
from .errors import CELBudgetExceeded, CELCompileError, CELError, CELRuntimeError
from .evaluator import DEFAULT_COST_LIMIT, DEFAULT_TIME_LIMIT_S
from .lint import validate_expression

__all__ = [
    "CELBudgetExceeded",
    "CELCompileError",
    "CELDevice",
    "CELError",
    "CELRuntimeError",
    "CompiledExpression",
    "DEFAULT_COST_LIMIT",
    "DEFAULT_TIME_LIMIT_S",
    "MAX_EXPRESSION_LENGTH",
    "MAX_NESTING_DEPTH",
    "SelectorCache",
    "compile_expression",
    "validate_expression",
]
