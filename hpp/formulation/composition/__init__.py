"""The composition problem: how many copies of which candidate pipelines, under the inventory, for the
least iteration time; and the one solve path that answers it with a proven bound.

problem     the problem data (CompositionProblem) and its memos (ProblemCaches)
objective   pipeline time, block-wise gradient sync, the objective T_pipe + T_sync + T_opt
settings    SolverSettings (CP-SAT parameters as text, limits, workers, seed)
cpsat       the CP-SAT model, one function per constraint family
milp        the same problem as a MILP (scipy / HiGHS)
heuristics  greedy, fill and local-search incumbents
sync_pricing, sync_floor, bound_model, lp_bound, copy_bound, step_lp
            the search's sync prices and the lower bounds (sync floor, bound problem, LP, copy B&B)
solve       ``solve(problem, settings)``: CP-SAT, MILP or heuristic behind one interface, one status vocabulary

Import each name from the module that defines it (``from hpp.formulation.composition.solve import solve``).

>>> from hpp.formulation.composition.settings import SolverSettings
>>> SolverSettings().solver
'cp-sat'
"""
