"""An instance's life as functions over the Vast client: create, wait until ready, destroy, and teardown
with its proof of absence (`absence`: when reads of an instance prove it gone).

A run and `reap` delete through the same `lifecycle.teardown_instance`, so an orphan is proven gone exactly as a
run's own instance is.
"""
