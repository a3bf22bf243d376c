"""Package-dir mapping: envs/ and kernels/ import as jaxdm.envs and jaxdm.kernels."""
from setuptools import find_packages, setup

_MAPPED = {"jaxdm": "jaxdm", "jaxdm.envs": "envs", "jaxdm.kernels": "kernels"}


def _packages():
    pkgs = []
    for name, folder in _MAPPED.items():
        pkgs.append(name)
        pkgs += [f"{name}.{sub}" for sub in find_packages(folder)]
    return sorted(set(pkgs))


setup(
    packages=_packages(),
    package_dir=_MAPPED,
    package_data={"": ["*.yaml", "*.json", "*.txt", "*.md", "*.safetensors", "*.cc", "*.h"]},
)
