"""
Live queries: the rindle AST, the value comparator, and the reference evaluator
that every incremental operator is checked against.
"""
