"""OLMo 2 (allenai/OLMo-2-0425-1B architecture): the family description."""
