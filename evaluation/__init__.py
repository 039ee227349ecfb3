"""What a model's predictions score, and the pictures of it: shared by training, cross-validation and predict.py."""
