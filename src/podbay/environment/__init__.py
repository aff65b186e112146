"""podbay.environment"""
