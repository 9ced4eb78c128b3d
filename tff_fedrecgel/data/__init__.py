"""Data pipeline: raw loaders, the split protocol, split files, client data.

Nothing here imports TensorFlow (``FederatedTrainData.as_tff_client_data``
imports it lazily).
"""

from tff_fedrecgel.data.client_data import FederatedTrainData
from tff_fedrecgel.data.loaders import RAW_COLUMNS
from tff_fedrecgel.data.loaders import filmtrust_pseudo_timestamps
from tff_fedrecgel.data.loaders import load_amazon_video
from tff_fedrecgel.data.loaders import load_csv
from tff_fedrecgel.data.loaders import load_filmtrust
from tff_fedrecgel.data.loaders import load_lastfm_2k
from tff_fedrecgel.data.loaders import load_qb_article
from tff_fedrecgel.data.preprocess import MIN_INTERACTIONS
from tff_fedrecgel.data.preprocess import NUM_HELDOUT_NEGATIVES
from tff_fedrecgel.data.preprocess import Split
from tff_fedrecgel.data.preprocess import build_split
from tff_fedrecgel.data.preprocess import sample_heldout_negatives
from tff_fedrecgel.data.split_io import file_fingerprint
from tff_fedrecgel.data.split_io import load_or_compute
from tff_fedrecgel.data.split_io import read_split
from tff_fedrecgel.data.split_io import write_split
from tff_fedrecgel.data.synthetic import SyntheticConfig
from tff_fedrecgel.data.synthetic import SyntheticTruth
from tff_fedrecgel.data.synthetic import generate_synthetic
from tff_fedrecgel.data.synthetic import generate_synthetic_with_truth
from tff_fedrecgel.errors import DataError

__all__ = [
    'DataError',
    'FederatedTrainData',
    'MIN_INTERACTIONS',
    'NUM_HELDOUT_NEGATIVES',
    'RAW_COLUMNS',
    'Split',
    'SyntheticConfig',
    'SyntheticTruth',
    'build_split',
    'file_fingerprint',
    'filmtrust_pseudo_timestamps',
    'generate_synthetic',
    'generate_synthetic_with_truth',
    'load_amazon_video',
    'load_csv',
    'load_filmtrust',
    'load_lastfm_2k',
    'load_or_compute',
    'load_qb_article',
    'read_split',
    'sample_heldout_negatives',
    'write_split',
]
