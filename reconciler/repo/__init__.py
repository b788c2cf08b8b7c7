"""The deployment repo: its definitions at one commit and how they are loaded and checked.

Callers import from the module that holds a name (``from reconciler.repo.definitions import
DeploymentRepo``, ``from reconciler.repo.load import load_repo``): this ``__init__`` imports
nothing, so a poll that loads no repo loads none of its readers (pygit2 among them). Inside,
bottom to top:

- ``tree``: reading a commit's files safely (YAML with lines and schemas is ``core.yamlfile``);
- ``windows``: maintenance windows, parsed and evaluated (pure);
- ``sops``, ``steps``, ``budgets``: what reconciler.yaml and ``secrets/`` define (SOPS files
  as committed, upgrade steps and stages, disruption budgets), parsed;
- ``placement``, ``planes``: which node runs which service, and the control planes (VIPs);
- ``definitions``: ``DeploymentRepo`` and ``ServiceDef``, frozen;
- ``checks``: what ``validate`` refuses; ``load``: ``load_repo``, from a tree;
- ``cutover``: the order a commit moves the VIP networks in, for a review.
"""
