"""From nothing to a fleet: ``init`` (a deployment repo skeleton, signed), ``node add`` (a node's
keys in the repo's trust root and secrets) and ``check`` (a node's settings against the remote,
as the agent will meet them). The operator's side of onboarding; the agent never imports it.
"""
