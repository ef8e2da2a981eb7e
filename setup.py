"""specdec: exact speculative decoding for T5X-style encoder-decoder models in JAX/Flax."""

import setuptools

setuptools.setup(
    name='specdec',
    version='0.1.0',
    description=('Speculative decoding (Leviathan, Kalman, Matias, ICML 2023) '
                 'for T5 1.1 / T5X encoder-decoder models in JAX and Flax.'),
    long_description=open('README.md', encoding='utf-8').read(),
    long_description_content_type='text/markdown',
    # Tested by CI on Python 3.11 (jax 0.10.2, the CPU torch build) and on the newest Python pyenv has (3.13: jax
    # 0.12, the CUDA torch build with triton), each with the versions pip resolves; 3.12 by hand (docs/install.md).
    python_requires='>=3.11',
    classifiers=[
        'Programming Language :: Python :: 3.11',
        'Programming Language :: Python :: 3.12',
        'Programming Language :: Python :: 3.13',
    ],
    packages=setuptools.find_packages(include=['specdec', 'specdec.*']),
    package_data={'specdec': ['assets/*.model', 'assets/*.vocab', 'assets/*.md',
                             'assets/test_slices/*/*.jsonl', 'assets/test_slices/*.md']},
    install_requires=[
        'jax>=0.4.30',
        'flax>=0.10',
        'optax',
        'gin-config',
        'seqio',
        'sentencepiece',
        'sacrebleu',
        'rouge-score',
        'numpy',
        'matplotlib',
        'safetensors>=0.4',
        'tensorstore>=0.1.60',
    ],
    extras_require={
        # torch pinned exactly: on Python 3.11 a CPU build of it is at hand (a newer spec pulls a CUDA build; on
        # 3.12 and newer pip takes the CUDA build either way). jax[tpu] brings libtpu at the jax version pip picks:
        # the tests compile programs for named Cloud TPU slices with XLA's TPU compiler, on the CPU.
        'test': ['pytest', 'pytest-xdist', 'scipy', 'torch==2.13.0', 'transformers>=5.24', 'jax[tpu]'],
        # The peer benchmark (specdec/bench/peers.py, scripts/peer_benchmark.py): Hugging Face generate on the same weights.
        'peers': ['torch==2.13.0', 'transformers>=5.24'],
    },
    entry_points={
        'console_scripts': [
            'specdec=specdec.main:main',
            'specdec-demo=specdec.demo:main',
        ],
    },
)
