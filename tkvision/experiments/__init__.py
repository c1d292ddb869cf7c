"""What users run on their own sweeps and models, apart from the library (which never imports it): ablation
sweeps (``sweep``), model benchmarks against timm's ViT (``benchmark``) and the parts of ``tkvision-benchmark``
(``benchmark_parts``). Their command lines are in ``tkvision.cli``; the studies behind the results pages live
in ``studies/`` of the repository, not in the package."""
