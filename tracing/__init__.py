# The pipeline's pure modules are imported compiled only when built from their current source.
from tracing import compiled

compiled.finder_install()
