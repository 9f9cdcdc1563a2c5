"""compress_model's options given flat, as the tests' parameter tables list them, put in their objects
(imported by ``tests/test_auto.py`` and ``tests/test_compress_model.py``)."""

import jaxbsd as jb

#: compress_model's options of a method, and of its execution, as a test's parameters give them flat.
METHOD_OPTIONS = ("config", "restarts", "warm_start", "selection", "auto_judge", "num_samples")
EXECUTION_OPTIONS = ("order", "group", "mesh", "mesh_axis", "state_dir", "resume", "finetune")


def call_with(args: dict) -> dict:
    """``args`` with the method's options given to ``jb.get_method`` and the execution's to ``jb.Execution``
    (either may raise the ``ValueError`` under test)."""
    args = dict(args)
    options = {k: args.pop(k) for k in METHOD_OPTIONS if k in args}
    execution = {k: args.pop(k) for k in EXECUTION_OPTIONS if k in args}
    if options:
        args["method"] = jb.get_method(args.get("method", "bsd"), **options)
    if execution:
        args["execution"] = jb.Execution(**execution)
    return args
