"""mmpack's implementation, private: its layers, one package each (``docs/architecture.md``).

Users import the root (:mod:`mmpack`) and the public modules beside this package
(:mod:`mmpack.torch`, :mod:`mmpack.ingest`, :mod:`mmpack.formats`, ...); every name here may move
between releases.
"""
