"""Function helpers with the names of `sagemaker_training.functions`: the
arguments of a function that a dict can supply, and a wrapper that turns any
exception into a given error class."""
import collections
import inspect

from .mapping import split_by_criteria

# What inspect.ArgSpec was before Python 3.11 removed it. The reference still
# builds inspect.ArgSpec, so its getargspec (and matching_args) raise
# AttributeError on 3.11+; this one works everywhere.
ArgSpec = collections.namedtuple("ArgSpec", "args varargs keywords defaults")


def getargspec(fn):
    """`fn`'s argument names, ``*`` name, ``**`` name and defaults."""
    spec = inspect.getfullargspec(fn)
    return ArgSpec(spec.args, spec.varargs, spec.varkw, spec.defaults)


def matching_args(fn, dictionary):
    """The items of `dictionary` that `fn` takes as arguments: all of them
    (the dictionary itself) when `fn` has ``**kwargs``."""
    spec = getargspec(fn)
    if spec.keywords:
        return dictionary
    return split_by_criteria(dictionary, spec.args).included


def error_wrapper(fn, error_class):
    """`fn`, raising ``error_class(e)`` (with e's traceback) for any exception e."""

    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # every failure becomes error_class
            raise error_class(e).with_traceback(e.__traceback__) from e

    return wrapper
