"""Templates + inventory -> a node's ``Desired`` slice.

Callers import from the module that does the work (``from reconciler.render.node import
render_node``): this ``__init__`` imports nothing, so the SOPS reader an agent needs does not
bring Jinja with it. Inside, bottom to top:

- ``secrets``: the SOPS files of the repo, opened (below the render: imported by name);
- ``sandbox``: the Jinja sandbox and the render's limits;
- ``environment``: a service's templates loaded, compiled once, rendered with errors located;
- ``facts``: the node's facts as templates read them (``facts``, ``ansible_facts``);
- ``variables``: what a template reads (``context``), the node's secrets among it (``SecretView``);
- ``runtime``: a service's runtime strings rendered and checked;
- ``node``: a service's render on a node, and the node's whole slice;
- ``vipnets``: the VIP networks as each node's services render them, checked;
- ``inputs``: what a service's render reads, and whether it changed between two commits.
"""
