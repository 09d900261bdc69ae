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

The public names are re-exported here (``from hpp.formulation.composition import CompositionProblem, solve``);
the submodules import each other, never this package, so there is no import cycle.

>>> from hpp.formulation.composition import CompositionProblem, SolverSettings, solve
>>> SolverSettings().solver
'cp-sat'
"""

from hpp.formulation.composition.problem import US_PER_S, CompositionProblem, ProblemCaches, to_us
from hpp.formulation.composition.objective import block_sync_s, composition_objective_s, pipeline_time_for_counts
from hpp.formulation.composition.settings import DEFAULT_SOLVER, SOLVER_NAMES, SolverSettings
from hpp.formulation.composition.sync_floor import SyncFloor
from hpp.formulation.composition.exact_step import export_cpsat_model
from hpp.formulation.composition.solve import SolveResult, certify, solve

__all__ = ["US_PER_S", "CompositionProblem", "ProblemCaches", "to_us", "block_sync_s", "composition_objective_s",
           "pipeline_time_for_counts", "DEFAULT_SOLVER", "SOLVER_NAMES", "SolverSettings", "SyncFloor",
           "SolveResult", "certify", "export_cpsat_model", "solve"]
