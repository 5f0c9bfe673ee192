"""The demo jobs the `shapeml` command runs, built on the library and apart from it.

`spotter_job` trains and evaluates the Spotter (`shapeml train`, `shapeml eval`); `int8_sort`
trains, quantizes and serves the int8 sorting transformer (`shapeml int8 ...`). Nothing in the
library imports this package.
"""
