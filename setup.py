"""The one compiled module: privacy_wall.noise._discrete_gaussian (Cython), built at install time.

Everything else about the package is in pyproject.toml; this file exists because the extension needs numpy's
include directory (numpy/random/bitgen.h), known only when the build runs.
"""

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

setup(
    ext_modules=cythonize(
        [
            Extension(
                "privacy_wall.noise._discrete_gaussian",
                ["privacy_wall/noise/_discrete_gaussian.pyx"],
                include_dirs=[numpy.get_include()],
                define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
            )
        ],
        compiler_directives={"language_level": "3"},
    )
)
