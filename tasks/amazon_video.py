"""Amazon Instant Video (McAuley et al.): ratings-only subset of PFedRec."""

from tff_fedrecgel.tasks.base import Task
from tff_fedrecgel.data import loaders

# The reference preprocessing fixes the item count.
AMAZON_VIDEO_NUM_ITEMS = 11_830

TASK = Task(
    name='amazon_video',
    raw_file='amazon-video-ratings.dat',
    rho_sh=0.01,
    rho_ns=0.2,
    num_items=AMAZON_VIDEO_NUM_ITEMS,
    description='Amazon Instant Video ratings (item count fixed to 11,830).',
    reader=loaders.load_amazon_video,
)
