"""SWE-bench over the official ``swebench`` package (``pip install 'jaxdm[swebench]'``).

``grading``: an instance (the package's dataset format, read by its own loader) is checked
out into a per-episode sandbox folder, edited there, and graded by running its eval script
in that folder and reading the test log with the package's own log parsers and report
(``swebench.harness.grading.get_eval_report``). Real instances' eval scripts expect their
container (``/testbed``, conda); see the README for that path.

``env``: ``SWEBenchEnv``, the tool-call environment over those sandboxes (view / edit /
run_tests / submit, 50 turns, reward from ``grading.grade``). ``trajectories``: SWE-agent
``.traj`` files as ``jaxdm.trajectory.Trajectory`` (for ``jaxdm screen``; standard library
only, no ``swebench`` needed). Submodules are imported on use.
"""

# seed 001: 50 turns per R2E-Gym / SWE-bench Verified episode (the env's budget, and the
# budget a converted SWE-agent trajectory is screened under unless told otherwise)
SWE_TURN_BUDGET = 50
